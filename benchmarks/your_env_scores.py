"""Environments nobody in rlherd wrote, at the budgets and seeds the "Bring your own environment"
issue names, with the shipped presets:

- ``ppo-doorkey``: PPO on ``MiniGrid-DoorKey-5x5-v0``, 300k steps (goal: final training return
  0.85; PPO in the MiniGrid authors' starter code solves it within about 100k frames);
- ``dqn-taxi``: DQN on ``Taxi-v3``, 200k steps, greedy evaluations of 100 episodes every 100k
  (goal: 7.0; the optimum is about 7.9, with a per-episode spread of about 2.5);
- ``impala-empty-mono``, ``-poly``, ``-distributed``: IMPALA on ``MiniGrid-Empty-5x5-v0``,
  100k steps (goal: 0.9), dict observations crossing every process boundary;
- ``impala-nethack``: IMPALA on ``NetHackScore-v0`` on ``mono``, 2M steps (goal: a mean
  training return of 60; a uniformly random policy scores about 25), and its steady steps/s.

Each is one run of seed 1 (``--seeds`` for more) in ``--out``; a finished run there is reported
again, not retrained, and a stopped one continues from its last checkpoint (the NetHack run can
so go in pieces: stop it, run the command again). Prints one JSON line per run: the final
training return (last 20 episodes, and last 100), the last greedy evaluation where there is
one, wall time and steps/s.

Usage: python benchmarks/your_env_scores.py [--figures ppo-doorkey dqn-taxi ...]
       [--seeds 1] [--out runs/your_env_scores]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

from rlherd.commands.plot import load_curves
from rlherd.commands.train import train_to
from rlherd.run.provenance import machine

# name -> (agent, env, runtime, steps, goal, what the goal is of, eval_every)
FIGURES: dict[str, tuple[str, str, str, int, float, str, int | None]] = {
    "ppo-doorkey": ("ppo", "MiniGrid-DoorKey-5x5-v0", "single", 300_000, 0.85, "final", None),
    "dqn-taxi": ("dqn", "Taxi-v3", "single", 200_000, 7.0, "greedy", 100_000),
    **{f"impala-empty-{r}": ("impala", "MiniGrid-Empty-5x5-v0", r, 100_000, 0.9, "final", None)
       for r in ("mono", "poly", "distributed")},
    "impala-nethack": ("impala", "NetHackScore-v0", "mono", 2_000_000, 60.0, "final", None),
}
MACHINE = machine()


def last_greedy(run_dir: Path) -> float | None:
    """The last evaluation's mean greedy return, if the run evaluated."""
    path = run_dir / "metrics" / "evaluator.csv"
    if not path.exists():
        return None
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return float(rows[-1]["eval_return_mean"]) if rows else None


def figure(name: str, seed: int, out: Path) -> dict:
    agent, env, runtime, steps, goal, of, eval_every = FIGURES[name]
    run_dir = out / f"{name}-seed{seed}"
    run = train_to(agent, env, run_dir, steps, seed, progress=False, runtime=runtime,
                   eval_every=eval_every, eval_episodes=100 if eval_every else None)  # fmt: skip
    if run.stopped:
        sys.exit(f"stopped; the same command continues {run_dir}")
    _, curves = load_curves(run_dir)
    returns = curves[""]
    value = run.summary["final_return_mean"] if of == "final" else last_greedy(run_dir)
    return dict(bench="your_env_scores", figure=name, agent=agent, env=run.config.env,
                runtime=runtime, seed=seed, steps=run.summary["actor_steps"],
                final_return_20=run.summary["final_return_mean"],
                final_return_100=float(np.mean(returns[-100:])) if len(returns) else None,
                greedy_return=last_greedy(run_dir), goal=goal, goal_of=of,
                reached=value is not None and value >= goal,
                wall_time_s=run.summary["wall_time_s"], sps=run.summary["sps"],
                run_dir=str(run_dir), machine=MACHINE)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--figures", nargs="*", default=list(FIGURES), choices=list(FIGURES))
    parser.add_argument("--seeds", type=int, nargs="*", default=[1])
    parser.add_argument("--out", type=Path, default=Path("runs/your_env_scores"))
    args = parser.parse_args()
    for name in args.figures:
        for seed in args.seeds:
            print(json.dumps(figure(name, seed, args.out)), flush=True)


if __name__ == "__main__":
    main()
