"""Off-policy continuous control: D4PG and MPO (and DDPG, DMPO on request) next to PPO's shipped
preset, on Gymnasium's MuJoCo tasks, with published figures beside them.

For each environment, agent and seed: one ``rlherd train`` run of ``--steps`` steps on the single
runtime with the preset ``rlherd train`` picks for the environment (``mujoco`` for HalfCheetah
and Hopper: Acme's baselines for D4PG and MPO; RL Zoo's tuned ``halfcheetah`` and CleanRL's
defaults for PPO), then ``--eval-episodes`` mean-action episodes. Prints one JSON line per run
(final training return over the last 20 episodes, mean-action return, steps/s, wall time, the
published figure), then a Markdown table. Runs stay in ``--out``; a finished run there is
evaluated again, not retrained, and a stopped one (Ctrl-C, SIGTERM) continues from its last
checkpoint, so a run of hours can go in pieces.

Published figures at 1M steps (RL Zoo's benchmark.md, deterministic evaluation, one seed, the
-v3 tasks): TD3 9,656 on HalfCheetah and 3,606 on Hopper; SAC 9,535 and 2,326. On Pendulum-v1
at 20k steps: TD3 -152, SAC -157. Acme publishes no Gymnasium MuJoCo numbers for D4PG or MPO.

``--alternative`` also trains Stable-Baselines3's TD3 (the strongest single-purpose peer; the
``bench`` extra installs it) with RL Zoo's hyperparameters for the task, on the same machine in
the same invocation, with one intra-op thread as rlherd's runs use, and prints its final
training return (last 20 episodes), mean-action return and steps/s the same way. It is trained
again on every invocation (its episodes go to ``--out/sb3-td3-ENV-seedN/monitor.csv``).
``--alternative preset`` gives it instead the values of rlherd's TD3 preset for the task (the
TD3 paper's on MuJoCo), so that the two differ only in implementation: both updates are the TD3
authors' (``docs/benchmarks/continuous-control.md``), and what is left is the loop around them.

``--quick`` is a CI-sized budget (5,000 steps on each task): it checks that every pair runs and
prints its figures, not that it learns.

Usage: python benchmarks/continuous_control.py [--steps 1000000] [--quick] [--alternative [preset]]
       [--agents d4pg mpo ppo] [--envs HalfCheetah-v5 Hopper-v5] [--seeds 0]
       [--out runs/continuous_control]
A 1M-step run takes hours on a 2-core CPU; run environments or agents in separate invocations
to use both cores.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from rlherd.agents.continuous import preset_for
from rlherd.agents.td3.config import PRESETS, TD3Config
from rlherd.commands.evaluate import evaluate
from rlherd.commands.train import train_to
from rlherd.run.provenance import machine

# env -> (TD3, SAC) as RL Zoo publishes them (1M steps; Pendulum at 20k).
PUBLISHED = {
    "HalfCheetah-v5": (9656, 9535),
    "Hopper-v5": (3606, 2326),
    "Pendulum-v1": (-152, -157),
}
QUICK_STEPS = 5_000


def score(agent: str, env: str, steps: int, seed: int, out: Path, eval_episodes: int) -> dict:
    """Train one run (or continue or reuse the one ``out`` holds) and evaluate it."""
    run_dir = out / f"{agent}-{env}-seed{seed}"
    summary_path = run_dir / "summary.json"
    if train_to(agent, env, run_dir, steps, seed, progress=False).stopped:
        sys.exit(f"stopped; the same command continues {run_dir}")
    greedy = evaluate(run_dir, episodes=eval_episodes)
    summary = json.loads(summary_path.read_text())
    td3, sac = PUBLISHED.get(env, (None, None))
    return dict(bench="continuous_control", agent=agent, env=env, steps=summary["actor_steps"],
                seed=seed, learner_steps=summary["learner_steps"],
                final_return_mean=summary["final_return_mean"],
                mean_action_return=greedy["eval_return_mean"], sps=summary["sps"],
                wall_time_s=summary["wall_time_s"], published_td3=td3, published_sac=sac,
                machine=summary["machine"])  # fmt: skip


# RL Zoo's TD3 settings (hyperparams/td3.yml) beyond SB3's TD3 defaults (Adam 1e-3, batch 256,
# (400, 300) networks, one gradient step per environment step, polyak 0.005, policy delay 2):
# uniform random actions for the first 10,000 steps, then Gaussian noise of 0.1.
TD3_ZOO = {"Pendulum-v1": dict(gamma=0.98, buffer_size=200_000)}


def td3_zoo(env_id: str) -> tuple[dict, float]:
    """SB3's TD3 arguments for RL Zoo's settings, and the exploration noise's std."""
    return dict(learning_starts=10_000, **TD3_ZOO.get(env_id, {})), 0.1


def td3_preset(env_id: str) -> tuple[dict, float]:
    """SB3's TD3 arguments for rlherd's TD3 preset for the task, field by field, and the noise.

    Both act in ``[-1, 1]`` on these tasks, so the noises mean the same. SB3's TD3 takes one
    learning rate for the policy and the critics, and one-step targets, so a preset with two
    rates or n-step targets has no equivalent there."""
    config = TD3Config(**PRESETS[preset_for(env_id)])
    if config.critic_learning_rate != config.learning_rate or config.n_step != 1:
        raise ValueError(f"{env_id}'s TD3 preset has no Stable-Baselines3 equivalent")
    return dict(learning_rate=config.learning_rate, batch_size=config.batch_size,
                tau=config.tau, gamma=config.discount, buffer_size=config.replay_size,
                learning_starts=config.min_replay_size, policy_delay=config.policy_delay,
                target_policy_noise=config.policy_noise, target_noise_clip=config.noise_clip,
                policy_kwargs=dict(net_arch=dict(pi=list(config.policy_sizes),
                                                 qf=list(config.critic_sizes)))), config.sigma


def sb3_td3(env_id: str, steps: int, seed: int, out: Path, eval_episodes: int,
            values: str) -> dict:  # fmt: skip
    """Stable-Baselines3's TD3 with RL Zoo's settings (``values="zoo"``) or rlherd's preset's
    (``"preset"``): the row ``score`` prints for rlherd.

    Its training episodes go to ``out/sb3-td3-ENV-seedN/monitor.csv`` as they end, so a run of
    hours shows its progress. Unlike rlherd's runs it cannot be continued or reused: each
    invocation trains it again, over the last one's file.
    """
    from stable_baselines3 import TD3
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(1)
    run_dir = out / f"sb3-td3-{env_id}-seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    env = Monitor(gym.make(env_id), str(run_dir / "monitor.csv"))
    n = env.action_space.shape[0]
    kwargs, sigma = td3_zoo(env_id) if values == "zoo" else td3_preset(env_id)
    model = TD3("MlpPolicy", env, seed=seed,
                action_noise=NormalActionNoise(np.zeros(n), sigma * np.ones(n)), **kwargs)
    start = time.perf_counter()
    model.learn(steps)
    wall = time.perf_counter() - start
    greedy, _ = evaluate_policy(model, Monitor(gym.make(env_id)), eval_episodes,
                                deterministic=True)  # fmt: skip
    returns = env.get_episode_rewards()[-20:]
    td3, sac = PUBLISHED.get(env_id, (None, None))
    learner_steps = int(model.num_timesteps - min(steps, model.learning_starts))
    return dict(bench="continuous_control", agent=f"sb3-td3-{values}", env=env_id, steps=steps,
                seed=seed, learner_steps=learner_steps,
                final_return_mean=float(np.mean(returns)) if returns else None,
                mean_action_return=float(greedy), sps=round(steps / wall, 1),
                wall_time_s=round(wall, 1), published_td3=td3, published_sac=sac,
                machine=machine())  # fmt: skip


def table(rows: list[dict]) -> str:
    lines = ["| agent | env | steps | seed | final training return | mean-action return "
             "| steps/s | wall time | RL Zoo TD3 / SAC |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        published = "—" if r["published_td3"] is None else (
            f"{r['published_td3']:,} / {r['published_sac']:,}")  # fmt: skip
        final = r["final_return_mean"]
        lines.append(
            f"| {r['agent']} | {r['env']} | {r['steps']:,} | {r['seed']} | "
            f"{'—' if final is None else f'{final:,.1f}'} | {r['mean_action_return']:,.1f} | "
            f"{r['sps']:,.0f} | {r['wall_time_s'] / 60:.1f} min | {published} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS:,} steps per run")
    parser.add_argument("--agents", nargs="*", default=["d4pg", "mpo", "ppo"],
                        help="none, with --alternative, trains only Stable-Baselines3's TD3")
    parser.add_argument("--envs", nargs="+", default=["HalfCheetah-v5", "Hopper-v5"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--out", default="runs/continuous_control", help="where runs are kept")
    parser.add_argument("--alternative", nargs="?", const="zoo", choices=["zoo", "preset"],
                        help="also train Stable-Baselines3's TD3, with RL Zoo's settings or "
                             "rlherd's TD3 preset's")  # fmt: skip
    args = parser.parse_args()
    if args.alternative and importlib.util.find_spec("stable_baselines3") is None:
        # Found after rlherd's runs, this would be an ImportError after their hours.
        parser.error("--alternative trains Stable-Baselines3's TD3, which is not installed: "
                     "pip install 'rlherd[bench]'")  # fmt: skip
    steps = QUICK_STEPS if args.quick else args.steps
    rows = []
    for env in args.envs:
        for agent in args.agents:
            for seed in args.seeds:
                rows.append(score(agent, env, steps, seed, Path(args.out), args.eval_episodes))
                print(json.dumps(rows[-1]), flush=True)
        for seed in args.seeds if args.alternative else []:
            rows.append(sb3_td3(env, steps, seed, Path(args.out), args.eval_episodes,
                                args.alternative))
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
