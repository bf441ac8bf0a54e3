"""IMPALA on Pong through the ``mono`` runtime, this tree against an older commit of rlherd, in
alternating runs: the issue's layout (2 actors, batch 8, unroll 80, 57,600 agent steps) with 1
and with 8 environments per actor, steady agent steps/s from each run's ``learner.csv``.

The older commit is checked out into a temporary git worktree, and each training run is its own
process with that tree first on ``sys.path`` (``trees.py``), so both trees run on the same
machine in the same session; their order alternates, as this kind of machine's
speed drifts within minutes. Prints one JSON line per run and one per round and layout with the
ratio. ``--set key=value`` applies to this tree's runs only (e.g. ``precision=bfloat16``).
Usage: python benchmarks/mono_against.py [--rev 125efb9] [--rounds 3] [--layouts 8 1]
         [--set precision=bfloat16]
"""

from __future__ import annotations

import argparse
import json

from trees import ROOT, older_tree, run_in

from rlherd.config import parse_set
from rlherd.run.provenance import machine

MACHINE = machine()

# One training run, in a process of its own: rlherd is whichever tree PYTHONPATH puts first.
RUN = """
import csv, json, os, sys, tempfile
import rlherd

if __name__ == "__main__":
    k, extra = int(sys.argv[1]), json.loads(sys.argv[2])
    with tempfile.TemporaryDirectory() as tmp:
        rlherd.train("impala", "ALE/Pong-v5", runtime="mono", total_steps=57_600, run_dir=tmp,
                     progress=False, checkpoint_interval_s=1e9, log_interval_s=1.0, batch_size=8,
                     unroll_length=80, num_actors=2, envs_per_actor=k, **extra)
        with open(os.path.join(tmp, "metrics", "learner.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
    a, b = rows[len(rows) // 5], rows[-1]  # leave out start-up
    steps = int(b["actor_steps"]) - int(a["actor_steps"])
    print(json.dumps(steps / (float(b["learner_walltime"]) - float(a["learner_walltime"]))))
"""


def steps_per_s(script: str, tree: str, envs_per_actor: int, extra: dict) -> float:
    return float(run_in(tree, script, str(envs_per_actor), json.dumps(extra)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rev", default="125efb9", help="the older commit (the issue's today)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layouts", type=int, nargs="+", default=[8, 1], help="envs per actor")
    parser.add_argument("--set", nargs="*", default=[], help="key=value for this tree's runs")
    args = parser.parse_args()
    extra = parse_set(args.set)  # strings: rlherd.train parses them as its fields' types
    with older_tree(args.rev, RUN) as (script, old):
        for round_ in range(args.rounds):
            for k in args.layouts:
                figures = {}
                for name, tree, given in ((args.rev, old, {}), ("this", ROOT, extra)):
                    figures[name] = steps_per_s(script, tree, k, given)
                    print(json.dumps(dict(bench="mono_against", tree=name, round=round_,
                                          envs_per_actor=k, set=given,
                                          steps_per_s=round(figures[name], 1),
                                          machine=MACHINE)), flush=True)  # fmt: skip
                print(json.dumps(dict(bench="mono_against", round=round_, envs_per_actor=k,
                                      set=extra, rev=args.rev,
                                      ratio=round(figures["this"] / figures[args.rev], 3),
                                      machine=MACHINE)), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
