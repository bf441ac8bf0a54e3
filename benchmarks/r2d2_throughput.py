"""R2D2's replay throughput on the ``single`` and ``mono`` runtimes: sequences inserted and
sampled per second, learner steps per second and environment steps per second, while it trains
``rlherd/MaskedCartPole-v1`` with its shipped preset (sequences of 49 rows every 20 steps, 16
samples per insert, batches of 32 sequences).

There is no PyTorch R2D2 to run beside it (Acme's needs JAX and Reverb), so the same run
trains rlherd's DQN (``classic`` preset: feed-forward, one transition per step) on the same
task and runtime as the reference: what recurrence and sequences cost against transitions.
Counts are read from the run's final checkpoint (the replay table's limiter counters). Prints
one JSON line per (agent, runtime). Usage:
  python benchmarks/r2d2_throughput.py [--steps 60000] [--runtimes single mono] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

import rlherd
from rlherd.run.provenance import machine

ENV = "rlherd/MaskedCartPole-v1"
MACHINE = machine()
AGENTS = {"r2d2": {}, "dqn": dict(preset="classic")}


def measure(agent: str, runtime: str, steps: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run = rlherd.train(agent, ENV, runtime=runtime, total_steps=steps, seed=seed,
                           run_dir=Path(tmp) / "run", progress=False, **AGENTS[agent])  # fmt: skip
        pointer = (Path(tmp) / "run" / "checkpoints" / "latest").read_text()
        checkpoint = torch.load(Path(tmp) / "run" / "checkpoints" / pointer, weights_only=False)
    inserts, samples, _ = checkpoint["tables"][0]["limiter"].tolist()
    s = run.summary
    wall = s["wall_time_s"]
    item = "sequences" if agent == "r2d2" else "transitions"
    return dict(agent=agent, runtime=runtime, env=ENV, env_steps=s["actor_steps"],
                wall_time_s=wall, env_steps_per_s=round(s["actor_steps"] / wall, 1),
                learner_steps=s["learner_steps"],
                learner_steps_per_s=round(s["learner_steps"] / wall, 1),
                item=item, inserted_per_s=round(inserts / wall, 1),
                sampled_per_s=round(samples / wall, 1),
                final_return_mean=s["final_return_mean"], **MACHINE)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60_000)
    parser.add_argument("--runtimes", nargs="+", default=["single", "mono"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for runtime in args.runtimes:
        for agent in AGENTS:
            print(json.dumps(measure(agent, runtime, args.steps, args.seed)), flush=True)


if __name__ == "__main__":
    main()
