"""Learners on CUDA against the CPU: the same ``rlherd.train`` run on each, one machine, one run.

Whether a GPU pays off depends on the network and the batch: MinAtar's small network did not
(docs/benchmarks/throughput.md), so each run here is timed on ``cuda`` and on the CPU, back to
back, and the ratio is what to read. The runs:

  sac, td3   Hopper-v5 on ``single`` (the RL Zoo presets: 256x256 networks, batch 256, one
             update an environment step), 1,000 random steps then 3,000 with updates;
  impala     ALE/Pong-v5 on ``mono`` (the ``atari`` preset's network) with ``--actors``
             actor processes, 150,000 agent steps.

The CPU runs use ``--cpu-threads`` intra-op threads (mono's actors act on their own cores).
Prints one JSON line per run: agent steps/s and learner steps/s over the run's wall time.
Usage: python benchmarks/learners_on_cuda.py [--runs sac td3 impala] [--devices cuda cpu]
       [--cpu-threads 1] [--actors 12]
"""

from __future__ import annotations

import argparse
import json
import tempfile

import rlherd
from rlherd.run.provenance import machine

# name: (agent, env id, runtime, total steps, overrides)
RUNS = {
    "sac": ("sac", "Hopper-v5", "single", 4_000, dict(min_replay_size=1_000)),
    "td3": ("td3", "Hopper-v5", "single", 4_000, dict(min_replay_size=1_000)),
    "impala": ("impala", "ALE/Pong-v5", "mono", 150_000, {}),
}


def measure(name: str, device: str, threads: int, actors: int) -> dict:
    """One run of ``name`` on ``device``; its rates over the run's own wall time."""
    agent, env, runtime, steps, overrides = RUNS[name]
    if runtime == "mono":
        overrides = {**overrides, "num_actors": actors}
    with tempfile.TemporaryDirectory() as run_dir:
        run = rlherd.train(agent, env, runtime=runtime, total_steps=steps, seed=0,
                           run_dir=run_dir, progress=False, device=device,
                           torch_threads=threads, **overrides)  # fmt: skip
    s = run.summary
    return dict(run=name, env=env, runtime=runtime, device=device, torch_threads=threads,
                actor_steps=s["actor_steps"], learner_steps=s["learner_steps"],
                wall_s=s["wall_time_s"],
                steps_per_s=round(s["actor_steps"] / s["wall_time_s"], 1),
                learner_steps_per_s=round(s["learner_steps"] / s["wall_time_s"], 1))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", choices=sorted(RUNS), default=list(RUNS))
    parser.add_argument("--devices", nargs="+", default=["cuda", "cpu"])
    parser.add_argument("--cpu-threads", type=int, default=1,
                        help="intra-op threads of the CPU runs (cuda runs: 1)")  # fmt: skip
    parser.add_argument("--actors", type=int, default=12, help="mono's actor processes")
    args = parser.parse_args()
    print(json.dumps({"machine": machine()}), flush=True)
    for name in args.runs:
        for device in args.devices:
            threads = args.cpu_threads if device == "cpu" else 1
            print(json.dumps(measure(name, device, threads, args.actors)), flush=True)


if __name__ == "__main__":  # each of mono's actor processes imports this script
    main()
