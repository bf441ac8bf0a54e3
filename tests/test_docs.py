"""The commands the guides show run as shown (with a short budget), and say what the guides say
they say."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "your-own-environment.md"


def _blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(), flags=re.S)


def _rlherd(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """``rlherd ARGS`` as the console script runs it: the working directory not on the import
    path unless ``PYTHONPATH`` says so."""
    code = "import sys; from rlherd.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, text=True,
                          capture_output=True, timeout=300, env={**os.environ, **env})  # fmt: skip


TRAIN_LINES = [line for block in _blocks(GUIDE, "bash") for line in block.splitlines()
               if line.startswith("rlherd train")]  # fmt: skip


@pytest.mark.parametrize("line", TRAIN_LINES)
def test_the_guides_training_commands_run(line, tmp_path):
    args = shlex.split(line)[1:] + ["--total-steps", "200", "--no-progress", "--run-dir",
                                    str(tmp_path / "run")]  # fmt: skip
    out = _rlherd(args, tmp_path)
    assert out.returncode == 0, out.stderr


def test_the_guides_console_sessions_say_what_they_show(tmp_path):
    """Each ``$ rlherd ...`` line of a console block prints the lines shown after it (up to
    ``...``, which stands for what varies)."""
    for block in _blocks(GUIDE, "console"):
        command, *shown = block.strip().splitlines()
        args = shlex.split(command.removeprefix("$ "))[1:]
        if args[0] == "check-env":
            args += ["--seconds", "0.1"]
        out = _rlherd(args, tmp_path)
        printed = out.stdout + out.stderr
        for line in shown:
            for part in line.split("..."):
                assert part.strip() in printed, (command, part)


def test_the_guides_factory_runs_from_python_and_the_command_line(tmp_path):
    """``my_envs.py`` and the script that trains with it, as the guide writes them, then the
    command line the guide gives for the same factory."""
    blocks = _blocks(GUIDE, "python")
    factory = next(b for b in blocks if b.startswith("# my_envs.py"))
    script = next(b for b in blocks if "rlherd.train" in b)
    (tmp_path / "my_envs.py").write_text(factory)
    short = 'env_kwargs={"size": 4}, total_steps=200, progress=False)'
    (tmp_path / "script.py").write_text(script.replace('env_kwargs={"size": 4})', short))
    out = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, text=True,
                         capture_output=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    command = "PYTHONPATH=. rlherd train ppo --env my_envs:make_env"
    assert command in GUIDE.read_text()
    args = shlex.split(command)[2:] + ["--total-steps", "200", "--no-progress"]
    out = _rlherd(args, tmp_path, PYTHONPATH=".")
    assert out.returncode == 0, out.stderr
