"""The Acme paper's actor-scaling and rate-limiter studies (sections 4.3-4.5, Figures 6 and 7):
D4PG on the ``distributed`` runtime, on ``Pendulum-v1`` by default (``--env``: the paper ran
Control Suite tasks such as ``dm_control/cartpole-swingup-v0`` for millions of steps, which
needs a bigger machine and ``--total-steps``).

- ``--figure 6``: 1, 2, 4 and 8 actor nodes at a fixed samples-per-insert (``--spi``, 32 by
  default, Acme's D4PG default). Each environment step sleeps ``--latency-ms`` first (a slow
  simulator, or a robot), so actors wait rather than compute and a 2-core machine can hold 8 of
  them. The rate limiter ties learner steps to actor steps, so the curves against actor steps
  should overlay (the same agent), while more actors reach a return sooner in the learner's
  walltime.
- ``--figure 7``: samples per insert 8, 32, 128 and unlimited (``inf``: the learner samples as
  fast as it can) with ``--actors`` actors and no latency. The ratio sets how many learner steps
  each actor step buys: return against actor steps and against the learner's walltime.

Returns are training returns, the mean of each run's last ``--window`` episodes; time to return
is the learner's walltime (the paper's axis: from the learner's first step, so Ray's start and
the first ``min_replay_size`` steps, which take longer with fewer actors, are not in it) at which
that moving mean first reaches ``--target``. Runs stay in
``--out/fig<N>/<setting>-seed<S>``: running the command again keeps finished runs of the same
settings, so a figure can go in pieces. Prints one JSON line per run, one per setting (seeds'
mean, and for Figure 6 the speed-up in time-to-return against the first setting, each seed
against itself: 1 actor unless ``--settings`` says), and writes the plot to
``--out/fig<N>/fig<N>.png``.

Usage: python benchmarks/actor_scaling.py --figure 6 [--seeds 0 1] [--total-steps 20000]
       [--latency-ms 10] [--spi 32] [--out runs/actor_scaling]
       python benchmarks/actor_scaling.py --figure 7 [--seeds 0 1] [--total-steps 30000]
On a bigger machine, the paper's task: --env dm_control/cartpole-swingup-v0 --total-steps
1000000 --target 700 (a Control Suite return; --target is Pendulum's -400 by default).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

import rlherd
from rlherd import envs as rl_envs
from rlherd.agents.continuous import preset_for
from rlherd.run.provenance import machine

ACTORS = (1, 2, 4, 8)
RATIOS = (8.0, 32.0, 128.0, math.inf)


class Latency(gym.Wrapper):
    """Each step waits ``seconds`` before it is taken: a simulator or robot slower than the
    policy, so that more actors mean more steps per second on any number of cores."""

    def __init__(self, env: gym.Env, seconds: float):
        super().__init__(env)
        self.seconds = seconds

    def step(self, action):
        time.sleep(self.seconds)
        return self.env.step(action)


@rlherd.env_factory
def slow_env(env_id: str = "Pendulum-v1", latency_ms: float = 10.0) -> gym.Env:
    """``env_id`` behind :class:`Latency`: the environment id ``actor_scaling:slow_env`` (this
    file's folder is on the actors' import path)."""
    return Latency(rl_envs.make(env_id), latency_ms / 1000.0)


def train(run_dir: Path, seed: int, args: argparse.Namespace, actors: int, spi: float,
          latency_ms: float) -> dict:  # fmt: skip
    """One D4PG run (the preset of ``--env`` but for the ratio). A finished run in ``run_dir``
    with the same settings is kept; anything else (stopped on the way: runs write their summary
    as they go; other actors, ratio, latency, length) is trained again."""
    env_id, env_kwargs = args.env, {}
    if latency_ms > 0:
        env_id = "actor_scaling:slow_env"
        env_kwargs = dict(env_id=args.env, latency_ms=latency_ms)
    if not same_run(run_dir, env_id, env_kwargs, actors, spi, args.total_steps):
        rlherd.train("d4pg", env_id, runtime="distributed", preset=preset_for(args.env),
                     seed=seed, total_steps=args.total_steps, run_dir=run_dir, overwrite=True,
                     progress=False, num_actors=actors, env_kwargs=env_kwargs,
                     samples_per_insert=spi)  # fmt: skip
    return json.loads((run_dir / "summary.json").read_text())


def same_run(run_dir: Path, env_id: str, env_kwargs: dict, actors: int, spi: float,
             total_steps: int) -> bool:  # fmt: skip
    """Whether ``run_dir`` holds a finished run of these settings."""
    if not (run_dir / "summary.json").exists():
        return False
    record = json.loads((run_dir / "config.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    ran = (record["env"], record["env_kwargs"], record["settings"]["num_actors"],
           record["config"]["samples_per_insert"], record["total_steps"])  # fmt: skip
    asked = (env_id, env_kwargs, actors, spi, total_steps)
    return ran == asked and summary.get("actor_steps", 0) >= total_steps


def curve(run_dir: Path, window: int) -> dict[str, np.ndarray]:
    """Actor steps, the learner's walltime and the moving mean of the last ``window`` training
    returns, at each episode's end. The learner logs its walltime against actor steps every
    5 s; an episode's is read between its two rows, and is 0 before the first row (up to 5 s
    into learning: too early for any run to reach a return worth timing)."""
    rows = np.genfromtxt(run_dir / "metrics" / "train.csv", delimiter=",", names=True, ndmin=1)
    learner = np.genfromtxt(run_dir / "metrics" / "learner.csv", delimiter=",", names=True,
                            ndmin=1)  # fmt: skip
    if learner.size == 0:
        raise SystemExit(f"{run_dir}: the learner never logged a step; give it more --total-steps")
    returns = rows["episode_return"]
    moving = np.convolve(returns, np.ones(window), "full")[: len(returns)]
    moving /= np.minimum(np.arange(1, len(returns) + 1), window)
    seconds = np.interp(rows["actor_steps"], learner["actor_steps"], learner["learner_walltime"],
                        left=0.0)  # fmt: skip
    return dict(steps=rows["actor_steps"], seconds=seconds, returns=moving)


def reached(c: dict[str, np.ndarray], target: float) -> tuple[int | None, float | None]:
    """Actor steps and the learner's walltime at which the moving mean first reaches ``target``
    (None: never)."""
    hit = np.flatnonzero(c["returns"] >= target)
    return (int(c["steps"][hit[0]]), float(c["seconds"][hit[0]])) if len(hit) else (None, None)


def label(figure: str, setting: float) -> str:
    if figure == "6":
        return f"{int(setting)} actor" + ("s" if setting > 1 else "")
    return "unlimited" if math.isinf(setting) else f"SPI {setting:g}"


def plot(figure: str, env_id: str, curves: dict[float, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (setting, runs) in enumerate(curves.items()):
        for j, c in enumerate(runs):
            for ax, x in zip(axes, ("steps", "seconds"), strict=True):
                ax.plot(c[x], c["returns"], color=f"C{i}", alpha=0.8,
                        label=label(figure, setting) if j == 0 else None)  # fmt: skip
    axes[0].set_xlabel("actor steps")
    axes[1].set_xlabel("learner walltime (s)")
    for ax in axes:
        ax.set_ylabel("training return (moving mean)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"D4PG on {env_id}, distributed: Acme's Figure {figure} (one line a seed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def setting_row(figure: str, setting: float, runs: list[dict], target: float,
                first: list[float | None] | None) -> dict:  # fmt: skip
    """One setting over its seeds: the mean final return, how many seeds reached ``target``
    and their mean steps and learner walltime to it, and (Figure 6) the speed-up in time
    against the first setting, whose seeds' times are ``first`` (None: this is it): each seed's
    ratio, over the seeds where both settings reached the target (seed noise in steps to the
    target is as large as the speed-up, so a seed is compared with itself)."""
    hits = [reached(c, target) for c in runs]
    steps = [n for n, _ in hits if n is not None]
    times = [t for _, t in hits if t is not None]
    row = dict(setting=label(figure, setting),
               final_train_return_mean=round(float(np.mean([c["returns"][-1] for c in runs])), 1),
               seeds_reaching_target=len(times),
               learner_time_to_target_s_mean=round(float(np.mean(times)), 1) if times else None,
               steps_to_target_mean=round(float(np.mean(steps))) if steps else None)  # fmt: skip
    if figure != "6" or first is None:
        return row
    ratios = [f / t for f, (_, t) in zip(first, hits, strict=True) if f is not None and t]
    if ratios:
        row.update(speedup_vs_first_mean=round(float(np.mean(ratios)), 2),
                   speedup_vs_first_range=[round(min(ratios), 2), round(max(ratios), 2)],
                   seeds_compared=len(ratios))  # fmt: skip
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--figure", choices=("6", "7"), required=True)
    parser.add_argument("--env", default="Pendulum-v1", help="a continuous task's id")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--total-steps", type=int, default=None,
                        help="actor steps a run (default: 20,000 for 6, 30,000 for 7)")
    parser.add_argument("--latency-ms", type=float, default=10.0,
                        help="each environment step's wait, Figure 6 (default: 10)")
    parser.add_argument("--spi", type=float, default=32.0,
                        help="samples per insert, Figure 6 (default: 32)")
    parser.add_argument("--actors", type=int, default=4, help="actor nodes, Figure 7")
    parser.add_argument("--settings", type=float, nargs="+", default=None,
                        help="actor counts (6) or ratios (7) to run (default: all)")
    parser.add_argument("--target", type=float, default=-400.0,
                        help="the return that time-to-return is measured to (default: -400)")
    parser.add_argument("--window", type=int, default=10, help="episodes in the moving mean")
    parser.add_argument("--out", type=Path, default=Path("runs/actor_scaling"))
    args = parser.parse_args()
    if args.total_steps is None:
        args.total_steps = 20_000 if args.figure == "6" else 30_000
    settings = args.settings or (ACTORS if args.figure == "6" else RATIOS)
    out = args.out / f"fig{args.figure}"
    if args.env != "Pendulum-v1":
        out = out / args.env.replace("/", "-")

    curves: dict[float, list[dict]] = {}
    for setting in settings:
        for seed in args.seeds:
            if args.figure == "6":
                actors, spi, latency = int(setting), args.spi, args.latency_ms
            else:
                actors, spi, latency = args.actors, setting, 0.0
            run_dir = out / f"{label(args.figure, setting).replace(' ', '-')}-seed{seed}"
            summary = train(run_dir, seed, args, actors, spi, latency)
            c = curve(run_dir, args.window)
            curves.setdefault(setting, []).append(c)
            at_step, at_time = reached(c, args.target)
            print(json.dumps(dict(
                bench="actor_scaling", figure=args.figure, actors=actors,
                samples_per_insert=str(spi), latency_ms=latency, seed=seed,
                final_train_return=round(float(c["returns"][-1]), 1),
                steps_to_target=at_step, learner_time_to_target_s=at_time, target=args.target,
                actor_steps=summary["actor_steps"], learner_steps=summary["learner_steps"],
                wall_time_s=summary["wall_time_s"], sps=summary["sps"],
                run_dir=str(run_dir))), flush=True)  # fmt: skip

    first = [reached(c, args.target)[1] for c in curves[settings[0]]]
    for setting in settings:
        row = setting_row(args.figure, setting, curves[setting], args.target,
                          first if setting != settings[0] else None)  # fmt: skip
        head = dict(bench="actor_scaling", figure=args.figure, seeds=args.seeds)
        print(json.dumps(head | row | dict(machine=machine())), flush=True)
    plot(args.figure, args.env, curves, out / f"fig{args.figure}.png")


if __name__ == "__main__":
    main()
