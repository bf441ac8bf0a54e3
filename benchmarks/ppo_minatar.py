"""PPO on MinAtar: steps/s and return of the ``minatar`` preset, against what PPO ran before it
had one (``--env MinAtar/...`` fell back to the CartPole preset: 8 x 32 rollouts, 20 full-batch
epochs) and against IMPALA's ``minatar`` preset on the same game, all in one run.

For each game and each of (ppo minatar, ppo classic, impala minatar), one ``rlherd train`` run of
``--steps`` agent steps on the single runtime, then 20 greedy evaluation episodes. Prints one
JSON line per run: steps/s, final training return (mean of the last 20 episodes), greedy return,
wall time, and PPO's steps/s as a share of IMPALA's.

Usage: python benchmarks/ppo_minatar.py [--steps 500000] [--games Breakout Freeway] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import tempfile

import rlherd
from rlherd.commands.evaluate import evaluate
from rlherd.run.provenance import machine

RUNS = (("ppo", "minatar"), ("ppo", "classic"), ("impala", "minatar"))
MACHINE = machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--games", nargs="+", default=["Breakout", "Freeway"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for game in args.games:
        env = f"MinAtar/{game}-v1"
        sps = {}
        for agent, preset in RUNS:
            with tempfile.TemporaryDirectory() as tmp:
                run = rlherd.train(agent, env, preset=preset, total_steps=args.steps,
                                   seed=args.seed, run_dir=tmp, progress=False)  # fmt: skip
                greedy = evaluate(tmp, episodes=20)
            sps[(agent, preset)] = run.summary["sps"]
            row = dict(bench="ppo_minatar", env=env, agent=agent, preset=preset,
                       steps=run.summary["actor_steps"], sps=run.summary["sps"],
                       final_return_mean=run.summary["final_return_mean"],
                       greedy_return_mean=greedy["eval_return_mean"],
                       wall_time_s=run.summary["wall_time_s"], seed=args.seed)  # fmt: skip
            if agent == "impala":
                row["ppo_sps_share_of_impala"] = {
                    p: round(v / row["sps"], 2) for (a, p), v in sps.items() if a == "ppo"
                }
            print(json.dumps(dict(row, machine=MACHINE)), flush=True)


if __name__ == "__main__":
    main()
