"""How long the ``rlherd`` command takes to answer ``--help``, against ``import torch``: the floor
every command paid while the CLI imported torch to list its agents and runtimes.

Each command runs in a fresh interpreter ``--repeat`` times after one unmeasured warm-up (which
fills the OS file cache and ``__pycache__``); the median wall time is printed, one JSON line per
command. ``rlherd`` is run as its console script does (``from rlherd.cli import main``), from
this tree's root, so the figures are this tree's (``python -c`` puts the working directory first
on ``sys.path``).

Usage: python benchmarks/cli_help.py [--repeat 9]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rlherd.run.provenance import machine

ROOT = Path(__file__).resolve().parents[1]
RLHERD = "import sys; from rlherd.cli import main; sys.exit(main())"
COMMANDS = {
    "rlherd --help": [sys.executable, "-c", RLHERD, "--help"],
    "rlherd train --help": [sys.executable, "-c", RLHERD, "train", "--help"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
}
MACHINE = machine()


def wall_time(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9, help="measured runs per command")
    args = parser.parse_args()
    for name, cmd in COMMANDS.items():
        wall_time(cmd)  # warm-up
        times = [wall_time(cmd) for _ in range(args.repeat)]
        print(json.dumps(dict(command=name, median_s=round(statistics.median(times), 3),
                              min_s=round(min(times), 3), max_s=round(max(times), 3),
                              repeat=args.repeat, **MACHINE)), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
