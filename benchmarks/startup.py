"""How long a tiny run takes from the command to its exit, as a user who tries a change waits for
it: ``rlherd train impala --env CartPole-v1 --runtime R --total-steps 2000`` on ``single`` and
``mono`` with 2 actors (CartPole's preset), 4 and 8, this tree against an older commit, in
alternating runs.

Each run is its own ``python -m rlherd.cli`` process with one tree first on ``sys.path``
(``trees.py``), so both trees run on the same machine in the same session. Start-up is most of
such a run: importing torch and rlherd, making the environments, and on ``mono`` starting the
actor processes. Prints one JSON line per run and, per runtime, the medians and their ratio.
Usage: python benchmarks/startup.py --rev 220ab76 [--rounds 5] [--actors 2 4 8]
"""

from __future__ import annotations

import argparse
import json
import statistics

from trees import ROOT, older_tree, run_in

from rlherd.run.provenance import machine

MACHINE = machine()

# One command, timed from a process of its own: rlherd is whichever tree PYTHONPATH puts first.
RUN = """
import subprocess, sys, tempfile, time

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "rlherd.cli", "train", "impala", "--env",
                        "CartPole-v1", "--total-steps", "2000", "--run-dir", tmp + "/run",
                        "--no-progress", *sys.argv[1:]],
                       check=True, capture_output=True, cwd=tmp)  # -m puts the cwd first
        print(time.perf_counter() - start)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rev", required=True, help="the older commit")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--actors", type=int, nargs="+", default=[2, 4, 8], help="on mono")
    args = parser.parse_args()
    layouts = ["--runtime single"] + [f"--runtime mono --num-actors {n}" for n in args.actors]
    seconds: dict[tuple[str, str], list[float]] = {}
    with older_tree(args.rev, RUN) as (script, old):
        for round_ in range(args.rounds):
            for layout in layouts:
                trees = [(args.rev, old), ("this", ROOT)]
                for name, tree in trees if round_ % 2 == 0 else trees[::-1]:
                    took = float(run_in(tree, script, *layout.split()))
                    seconds.setdefault((name, layout), []).append(took)
                    print(json.dumps(dict(bench="startup", tree=name, round=round_,
                                          flags=layout, seconds=round(took, 2),
                                          machine=MACHINE)), flush=True)  # fmt: skip
    for layout in layouts:
        old, new = (statistics.median(seconds[name, layout]) for name in (args.rev, "this"))
        print(json.dumps(dict(bench="startup", flags=layout, rev=args.rev, rounds=args.rounds,
                              median_s={args.rev: round(old, 2), "this": round(new, 2)},
                              ratio=round(new / old, 3), machine=MACHINE)), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
