"""DQN on MinAtar Breakout with the MinAtar paper's settings (the ``minatar_paper`` preset), for
a budget that fits a few minutes on 2 cores. Not a test: prints the return and steps/s.

The MinAtar paper (Young & Tian 2019) trains for 5M frames; a budget of a few hundred thousand
steps is an early point on its learning curve.

Usage: python benchmarks/dqn_minatar.py [--steps 150000] [--game Breakout]
"""

from __future__ import annotations

import argparse
import json
import tempfile

import rlherd
from rlherd.commands.evaluate import evaluate
from rlherd.run.provenance import machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=150_000)
    parser.add_argument("--game", default="Breakout")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    env = f"MinAtar/{args.game}-v1"
    with tempfile.TemporaryDirectory() as tmp:
        run = rlherd.train("dqn", env, total_steps=args.steps, seed=args.seed, run_dir=tmp,
                           preset="minatar_paper", progress=False)  # fmt: skip
        greedy = evaluate(tmp, episodes=20)
    print(json.dumps(dict(
        bench="dqn_minatar", env=env, steps=run.summary["actor_steps"],
        learner_steps=run.summary["learner_steps"], episodes=run.summary["episodes"],
        final_return_mean=run.summary["final_return_mean"],
        greedy_return_mean=greedy["eval_return_mean"], sps=run.summary["sps"],
        wall_time_s=run.summary["wall_time_s"],
        machine=machine(),
    )))  # fmt: skip


if __name__ == "__main__":
    main()
