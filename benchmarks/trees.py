"""This tree against an older commit of rlherd, on the same machine in the same session: the
older commit is checked out into a temporary git worktree, and each run is a process of its own
with one tree first on ``sys.path`` (every tree has ``rlherd.train``). Used by
``mono_against.py`` and ``box_unchanged.py``."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def older_tree(rev: str, script: str) -> Iterator[tuple[str, str]]:
    """``(path of script, path of rev's tree)``: ``script`` (the code of one run) written to a
    temporary file, and ``rev`` checked out beside it; both are removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        path, old = os.path.join(tmp, "run.py"), os.path.join(tmp, "tree")
        with open(path, "w") as f:
            f.write(script)
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", old, rev],
                       check=True, capture_output=True)  # fmt: skip
        try:
            yield path, old
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", old],
                           check=False, capture_output=True)  # fmt: skip


def run_in(tree: str, script: str, *args: str) -> str:
    """The last line ``script`` prints, run with ``tree``'s rlherd; its stderr if it fails."""
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, script, *args], env=env, capture_output=True,
                         text=True)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"{script} {args} failed with {tree}:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]
