"""Multi-seed runs (``train --seeds``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rlherd
from rlherd.cli import main
from rlherd.commands.seeds import parse_seeds
from rlherd.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TINY = ["ppo", "--env", "CartPole-v1", "--total-steps", "200"]
# The seeds' processes import this checkout's rlherd, as the test does.
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def rlherd_cli(args: list[str], cwd: Path, **kw) -> subprocess.Popen | subprocess.CompletedProcess:
    """``rlherd ARGS`` in a process of its own, as a user runs it."""
    command = [sys.executable, "-m", "rlherd.cli", *args]
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    if kw.pop("background", False):
        return subprocess.Popen(command, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)  # fmt: skip
    return subprocess.run(command, cwd=cwd, env=env, text=True, capture_output=True, timeout=300)


def configs(parent: Path) -> dict[str, dict]:
    return {p.name: json.loads((p / "config.json").read_text()) for p in parent.glob("seed-*")}


# ------------------------------------------------------------------------------ train --seeds
def test_seeds_are_parsed_from_ranges_and_lists():
    assert parse_seeds("1-5") == [1, 2, 3, 4, 5]
    assert parse_seeds("1,2,3") == [1, 2, 3]
    assert parse_seeds("0-2,10") == [0, 1, 2, 10]
    for bad in ("", "5-1", "a", "1-3,2", "1;2"):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seeds(bad)


def test_seeds_make_runs_that_differ_only_in_seed(tmp_path):
    out = rlherd_cli(["train", *TINY, "--seeds", "1-3", "--run-dir", "group", "--no-progress"],
                     tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    runs = configs(tmp_path / "group")
    assert sorted(runs) == ["seed-1", "seed-2", "seed-3"]
    assert [runs[f"seed-{k}"]["seed"] for k in (1, 2, 3)] == [1, 2, 3]
    without_seed = [{k: v for k, v in c.items() if k != "seed"} for c in runs.values()]
    assert without_seed[0] == without_seed[1] == without_seed[2]
    assert sorted(p.name for p in (tmp_path / "group").iterdir()) == sorted(runs)  # no logs left
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(line["seed"], line["actor_steps"]) for line in lines] == [(1, 200), (2, 200), (3, 200)]
    assert "rlherd report group" in out.stderr


def test_train_seeds_in_python_gives_every_seed_the_same_settings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", PYTHONPATH)
    result = rlherd.train_seeds("ppo", "CartPole-v1", seeds="4-5", run_dir="py", total_steps=200,
                                progress=False, learning_rate=1e-3, log_interval_s=2.0)  # fmt: skip
    assert not result.failed and not result.stopped
    assert [run.config.seed for run in result.runs] == [4, 5]
    for run in result.runs:
        assert run.config.config["learning_rate"] == 1e-3
        assert run.config.settings["log_interval_s"] == 2.0
        assert run.summary["actor_steps"] == 200


def test_a_failing_seed_is_one_line_and_a_nonzero_exit(tmp_path):
    out = rlherd_cli(["train", *TINY, "--seeds", "1-2", "--set", "no_such_field=1",
                      "--run-dir", "bad", "--no-progress"], tmp_path)  # fmt: skip
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("rlherd: error: seeds 1,2 failed: 'no_such_field' is neither"), line
    assert "bad/seed-*.log" in line and (tmp_path / "bad" / "seed-1.log").exists()


@pytest.mark.parametrize("flag", [["--seed", "3"], ["--resume", "runs/x"]])
def test_seeds_refuse_seed_and_resume(flag, capsys):
    assert main(["train", *TINY, "--seeds", "1-2", *flag]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"drop {flag[0]}" in err, err


def test_ctrl_c_stops_every_seed_with_a_checkpoint_and_resume_continues_them(tmp_path):
    """The group forwards SIGINT once to each seed (they run in sessions of their own, out of
    reach of a terminal's Ctrl-C), each stops with a checkpoint, none is left running, and
    ``--resume PARENT`` continues all of them."""
    group = tmp_path / "group"  # absolute: no other process on the machine names it
    parent = rlherd_cli(["train", "ppo", "--env", "CartPole-v1", "--total-steps", "10000000",
                         "--seeds", "1-3", "--jobs", "2", "--log-interval-s", "0.2",
                         "--run-dir", str(group), "--no-progress"], tmp_path,
                        background=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not all((group / f"seed-{k}" / "summary.json").exists() for k in (1, 2)):
            assert parent.poll() is None and time.monotonic() < deadline, parent.stderr.read()
            time.sleep(0.2)
        parent.send_signal(signal.SIGINT)
        _, err = parent.communicate(timeout=120)
    finally:
        parent.kill()
    assert parent.returncode == 130, err
    assert f"rlherd train --resume {group}`" in err
    assert "seed 3 had not started" in err and f"--seeds 3 --run-dir {group}`" in err
    assert not [cmd for cmd in _command_lines() if str(group) in cmd]
    steps = {}
    for k in (1, 2):
        assert (group / f"seed-{k}" / "checkpoints" / "latest").exists()
        steps[k] = json.loads((group / f"seed-{k}" / "summary.json").read_text())["actor_steps"]
    more = max(steps.values()) + 300
    out = rlherd_cli(["train", "--resume", str(group), "--total-steps", str(more),
                      "--no-progress"], tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    resumed = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["seed"] for r in resumed] == [1, 2]
    assert all(r["actor_steps"] >= more for r in resumed)  # to the end of the rollout past it


def _command_lines() -> list[str]:
    """The command lines of this machine's processes (to find any seed left running)."""
    lines = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):  # ended meanwhile
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
    return lines
