"""What a run or a benchmark ran on: rlherd's version and commit, the key packages' versions,
the CPU model, its cores and the threads torch uses, and the GPU if any.

Results differ by CPU and by library version, so a reader must be able to tell: every run
records :func:`machine` in ``config.json`` (where it started) and ``summary.json`` (where its
latest session ran), and every benchmark prints it beside its figures.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

# The packages whose versions change what a run does or how fast (those installed are listed).
PACKAGES = ("torch", "numpy", "gymnasium", "pettingzoo", "ale-py", "mujoco", "dm-control",
            "minari", "open_spiel", "ray", "grpcio")  # fmt: skip


def machine() -> dict[str, Any]:
    """This process's machine and software, as plain JSON values.

    >>> sorted(machine())[:4]
    ['commit', 'cores', 'cpu', 'gpu']
    """
    torch = sys.modules.get("torch")  # read, never imported here (rlherd --help stays fast)
    gpu = None
    if torch is not None and torch.cuda.is_available():
        gpu = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return dict(
        rlherd=_version("rlherd"),
        commit=_commit(),
        python=platform.python_version(),
        cpu=_cpu_model(),
        cores=os.cpu_count(),
        torch_threads=torch.get_num_threads() if torch is not None else None,
        gpu=gpu,
        packages={name: v for name in PACKAGES if (v := _version(name)) is not None},
    )


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def _commit() -> str | None:
    """The git commit rlherd's code came from (``-dirty`` when its files differ from it), or
    None outside a git checkout (an installed wheel)."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=5)  # fmt: skip
        if head.returncode != 0:
            return None
        changed = subprocess.run(["git", "-C", str(here), "status", "--porcelain",
                                  "--untracked-files=no"], capture_output=True, text=True,
                                 timeout=5)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if changed.stdout.strip() else "")


@functools.cache
def _cpu_model() -> str:
    """The CPU's model name (``platform.processor()`` says only ``x86_64`` on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
