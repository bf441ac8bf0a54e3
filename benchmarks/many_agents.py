"""PettingZoo's games on the host runtimes, one policy shared by every agent:

- ``spread-<runtime>``: PPO on MPE's ``simple_spread_v3`` (3 agents, ``local_ratio`` 0.5, 25
  steps a game, discrete actions: the game's defaults), 1M environment steps, on ``single``,
  ``mono`` and ``distributed``. Goal: a mean per-agent episode return of -20; a uniformly
  random policy gets about -26 (measured here, ``--random``).

Each is one run of seed 1 (``--seeds`` for more) in ``--out``; a finished run there is reported
again, not retrained, and a stopped one continues. Prints one JSON line per run: the mean
per-agent training return of its last 300 agent episodes (100 games), the greedy policy's over
100 games, steps/s and wall time.

Usage: python benchmarks/many_agents.py [--runtimes single mono distributed] [--seeds 1]
       [--steps 1000000] [--out runs/many_agents] [--random]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np
import torch

from rlherd.commands.evaluate import evaluate
from rlherd.commands.plot import load_curves
from rlherd.commands.train import train_to

SPREAD = "pettingzoo/mpe2.simple_spread_v3"
GOAL = -20.0
MACHINE = dict(cpu=platform.processor() or platform.machine(), cores=os.cpu_count(),
               torch=torch.__version__)  # fmt: skip


def random_return(games: int = 200, seed: int = 0) -> float:
    """A uniformly random policy's mean per-agent return over ``games`` games."""
    from rlherd.envs.pettingzoo import AgentRows

    rows, rng, returns = AgentRows(SPREAD, 1), np.random.default_rng(seed), []
    for game in range(games):
        rows.reset(seed=seed + game)
        total, done = np.zeros(rows.num_envs), False
        while not done:
            _, reward, terminated, truncated, _ = rows.step(rng.integers(0, 5, rows.num_envs))
            total, done = total + reward, bool((terminated | truncated).all())
        returns += total.tolist()
    rows.close()
    return float(np.mean(returns))


def figure(runtime: str, seed: int, steps: int, out: Path) -> dict:
    run_dir = out / f"spread-{runtime}-seed{seed}"
    run = train_to("ppo", SPREAD, run_dir, steps, seed, progress=False, runtime=runtime)
    _, curves = load_curves(run_dir)
    greedy = evaluate(run_dir, episodes=100)["eval_return_mean"]
    last = float(np.mean(curves[""][-300:]))
    return dict(bench="many_agents", figure=f"spread-{runtime}", env=SPREAD, seed=seed,
                steps=run.summary["actor_steps"], final_return_300=last,
                greedy_return_100_games=greedy, goal=GOAL, reached=greedy >= GOAL,
                wall_time_s=run.summary["wall_time_s"], sps=run.summary["sps"],
                run_dir=str(run_dir), machine=MACHINE)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtimes", nargs="+", default=["single", "mono", "distributed"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--out", default="runs/many_agents")
    parser.add_argument("--random", action="store_true", help="also the random policy's return")
    args = parser.parse_args()
    if args.random:
        line = dict(bench="many_agents", figure="spread-random", env=SPREAD,
                    random_return_200_games=random_return(), machine=MACHINE)
        print(json.dumps(line), flush=True)
    for runtime in args.runtimes:
        for seed in args.seeds:
            print(json.dumps(figure(runtime, seed, args.steps, Path(args.out))), flush=True)


if __name__ == "__main__":
    main()
