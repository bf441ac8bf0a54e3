"""The DeepMind Control Suite from state features: D4PG, MPO, SAC and TD3, with
Stable-Baselines3's SAC and TD3 beside them in the same run.

For each task, agent and seed: one ``rlherd train`` run of ``--steps`` environment steps (after
``--action-repeat``) on the single runtime with the agent's ``control`` preset (D4PG and MPO:
Acme's; SAC: the SAC paper's values, learning from 5,000 random steps as pytorch_sac does; TD3:
the TD3 paper's), then ``--eval-episodes`` mean-action episodes (10: an episode is 1,000 of the
suite's steps). Runs stay in ``--out``: a finished one is evaluated again, not retrained, and a
stopped one (Ctrl-C, SIGTERM) continues from its last checkpoint, so ``--seeds 0 1 2`` after
``--seeds 0`` trains only the new seeds.

``--alternative`` also trains Stable-Baselines3's SAC and TD3 (the ``bench`` extra installs
it; RL Zoo has no Control Suite entries) on the same environments as rlherd's (made by
``rlherd.envs.make``, with the same action repeat), with the same hyperparameters as rlherd's
SAC and TD3 presets: one gradient step per environment step (the same update-to-data ratio),
batches of 256, Adam at 3e-4, (256, 256) ReLU networks, tau 0.005; SAC with the automatic
temperature and 5,000 random steps, TD3 with noise 0.1, smoothing 0.2 clipped at 0.5, policy
delay 2 and 25,000 random steps. One intra-op thread, as rlherd's runs use.

Each line printed is one run's JSON: final training return (the last 10 episodes), mean-action
return, steps/s, wall time and the published figure; then, per task and agent, the IQM and range
over seeds, and a Markdown table.

Published figures at 100k environment steps, state features, SAC (no published D4PG, MPO or TD3
figure for these tasks at this budget was found; D4PG's are at 1e8 steps): ``PUBLISHED``, each
the mean of its source's 3 seeds (our averages of the per-seed values in the files):
- ``denisyarats/pytorch_sac`` ``data/sac.csv``: action repeat 1, evaluation returns;
- ``nicklashansen/tdmpc2`` ``results/sac/*.csv``: environment steps (its maintainer: the
  results count action repeat), the baseline's own action repeat not stated.
CURL's Table 1 "State SAC" (891 walker-walk, 616 cheetah-run) states no action repeat or step
convention for its state baseline, and is well above both files on cheetah-run, so it is not
used.

Usage: python benchmarks/control_suite.py [--steps 100000] [--action-repeat 1] [--seeds 0]
       [--agents d4pg mpo sac td3] [--tasks dm_control/walker-walk-v0 dm_control/cheetah-run-v0]
       [--alternative] [--eval-episodes 10] [--out runs/control_suite] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from rlherd import envs as rl_envs
from rlherd.agents import BUILDERS
from rlherd.commands.evaluate import evaluate
from rlherd.commands.train import resolve_config, train_to
from rlherd.config import check_seed
from rlherd.errors import ConfigError
from rlherd.run.provenance import machine
from rlherd.run.statistics import aggregate

TASKS = ["dm_control/walker-walk-v0", "dm_control/cheetah-run-v0"]
# SAC's published returns at 100k environment steps from state features: (pytorch_sac, TD-MPC2's
# SAC baseline), each a mean over 3 seeds (per seed: 674.5, 932.7, 934.5 and 697.1, 509.6, 917.8
# on walker-walk; 265.8, 256.0, 118.5 and 362.4, 331.1, 236.9 on cheetah-run).
PUBLISHED: dict[str, tuple[float, float]] = {
    "dm_control/walker-walk-v0": (847.2, 708.2),
    "dm_control/cheetah-run-v0": (213.5, 310.1),
}
QUICK_STEPS = 3_000


def env_options(repeat: int) -> dict:
    """The options of a task's environments: the action repeat, where it is above 1."""
    return {"action_repeat": repeat} if repeat > 1 else {}


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace, steps: int) -> None:
    """Refuse, in one line, what a run could not take (a count below 1, a seed numpy cannot
    seed with, an unknown agent or task, an agent that cannot act in a task's actions,
    ``--alternative`` without Stable-Baselines3) before anything trains: found in the middle of
    the loop, such an error would be a traceback after the earlier runs' hours."""
    repeat = args.action_repeat
    if repeat < 1:
        parser.error(f"--action-repeat must be at least 1, got {repeat}")
    if steps < repeat:
        parser.error(f"--steps must be at least the action repeat ({repeat}), got {steps}")
    if args.eval_episodes < 1:
        parser.error(f"--eval-episodes must be at least 1, got {args.eval_episodes}")
    for flag, values in (("--seeds", args.seeds), ("--agents", args.agents),
                         ("--tasks", args.tasks)):  # fmt: skip
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:  # the same run's row again, which the summary would count as another seed
            parser.error(f"{flag} names {', '.join(twice)} more than once")
    try:
        for seed in args.seeds:
            check_seed(seed, "--seeds")
        for task in args.tasks:
            spec = rl_envs.spec_for(task, **env_options(repeat))
            for agent in args.agents:
                config, _ = resolve_config(agent, task, None, {})
                BUILDERS[agent](config).make_networks(spec)  # an action space it cannot act in
    except ConfigError as e:
        parser.error(str(e))
    if args.alternative and importlib.util.find_spec("stable_baselines3") is None:
        parser.error("--alternative trains Stable-Baselines3's SAC and TD3, which are not "
                     "installed: pip install 'rlherd[bench]'")  # fmt: skip


def score(agent: str, task: str, steps: int, repeat: int, seed: int, out: Path,
          episodes: int) -> dict:  # fmt: skip
    """Train one run (or continue or reuse the one ``out`` holds) and evaluate it."""
    run_dir = out / f"{agent}-{task.split('/')[-1]}-ar{repeat}-seed{seed}"
    env_kwargs = env_options(repeat)
    # The budget counts environment steps; each agent step is `repeat` of them.
    run = train_to(agent, task, run_dir, steps // repeat, seed, progress=False,
                   env_kwargs=env_kwargs)  # fmt: skip
    if run.stopped:
        sys.exit(f"stopped; the same command continues {run_dir}")
    greedy = evaluate(run_dir, episodes=episodes)
    summary = json.loads((run_dir / "summary.json").read_text())
    return row(agent, task, repeat, seed, summary["final_return_mean"],
               greedy["eval_return_mean"], summary["actor_steps"] * repeat,
               summary["wall_time_s"], summary["machine"])  # fmt: skip


def row(agent, task, repeat, seed, final, greedy, steps, wall, ran_on: dict) -> dict:
    """One run's figures; ``ran_on`` is the machine that trained it (a run's summary has it:
    its intra-op threads are the run's own, where this script's may differ, and a run
    reused from ``--out`` may have trained on another machine)."""
    pytorch_sac, tdmpc2 = PUBLISHED.get(task, (None, None))
    return dict(bench="control_suite", agent=agent, task=task, action_repeat=repeat, seed=seed,
                env_steps=steps, final_return_mean=final, mean_action_return=greedy,
                sps=round(steps / wall, 1), wall_time_s=round(wall, 1),
                published_sac_pytorch_sac=pytorch_sac, published_sac_tdmpc2=tdmpc2,
                machine=ran_on)  # fmt: skip


def sb3(kind: str, task: str, steps: int, repeat: int, seed: int, episodes: int) -> dict:
    """Stable-Baselines3's SAC or TD3 with rlherd's presets' values (the module docstring)."""
    from stable_baselines3 import SAC, TD3
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(1)
    make = lambda: Monitor(rl_envs.make(task, **env_options(repeat)))
    env = make()
    common = dict(learning_rate=3e-4, batch_size=256, tau=0.005, gamma=0.99, train_freq=1,
                  gradient_steps=1, policy_kwargs=dict(net_arch=[256, 256]), seed=seed)
    if kind == "sac":
        model = SAC("MlpPolicy", env, learning_starts=5_000, ent_coef="auto", **common)
    else:
        n = env.action_space.shape[0]
        model = TD3("MlpPolicy", env, learning_starts=25_000, policy_delay=2,
                    target_policy_noise=0.2, target_noise_clip=0.5,
                    action_noise=NormalActionNoise(np.zeros(n), 0.1 * np.ones(n)), **common)
    start = time.perf_counter()
    model.learn(steps // repeat)
    wall = time.perf_counter() - start
    greedy, _ = evaluate_policy(model, make(), episodes, deterministic=True)
    returns = env.get_episode_rewards()[-10:]
    final = float(np.mean(returns)) if returns else None
    return row(f"sb3-{kind}", task, repeat, seed, final, float(greedy), steps, wall, machine())


def summaries(rows: list[dict]) -> list[dict]:
    """Per task and agent: the IQM and range of the mean-action returns over seeds."""
    out = []
    for key in sorted({(r["task"], r["agent"]) for r in rows}):
        values = [r["mean_action_return"] for r in rows if (r["task"], r["agent"]) == key]
        iqm = aggregate(values)["iqm"].value if len(values) > 1 else values[0]
        out.append(dict(bench="control_suite_summary", task=key[0], agent=key[1],
                        seeds=len(values), iqm=round(iqm, 1), low=round(min(values), 1),
                        high=round(max(values), 1)))  # fmt: skip
    return out


def table(rows: list[dict]) -> str:
    lines = ["| task | agent | seed | env steps | training return (last 10) | mean-action return "
             "| steps/s | wall time | published SAC at 100k (pytorch_sac / TD-MPC2) |",
             "|---" * 9 + "|"]
    for r in rows:
        final = "—" if r["final_return_mean"] is None else f"{r['final_return_mean']:,.1f}"
        published = "—" if r["published_sac_pytorch_sac"] is None else (
            f"{r['published_sac_pytorch_sac']:,.0f} / {r['published_sac_tdmpc2']:,.0f}")
        lines.append(f"| {r['task'].split('/')[-1]} | {r['agent']} | {r['seed']} | "
                     f"{r['env_steps']:,} | {final} | {r['mean_action_return']:,.1f} | "
                     f"{r['sps']:,.0f} | {r['wall_time_s'] / 60:.1f} min | {published} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=100_000, help="environment steps")
    parser.add_argument("--action-repeat", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS:,} steps per run")
    parser.add_argument("--agents", nargs="+", default=["d4pg", "mpo", "sac", "td3"])
    parser.add_argument("--tasks", nargs="+", default=TASKS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--out", default="runs/control_suite", help="where runs are kept")
    parser.add_argument("--alternative", action="store_true",
                        help="also train Stable-Baselines3's SAC and TD3")  # fmt: skip
    args = parser.parse_args()
    steps, repeat = (QUICK_STEPS if args.quick else args.steps), args.action_repeat
    check_args(parser, args, steps)
    rows = []
    for task in args.tasks:
        for agent in args.agents:
            for seed in args.seeds:
                rows.append(score(agent, task, steps, repeat, seed, Path(args.out),
                                  args.eval_episodes))  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
        for kind in ("sac", "td3") if args.alternative else ():
            for seed in args.seeds:
                rows.append(sb3(kind, task, steps, repeat, seed, args.eval_episodes))
                print(json.dumps(rows[-1]), flush=True)
    for line in summaries(rows):
        print(json.dumps(line))
    print(table(rows))


if __name__ == "__main__":
    main()
