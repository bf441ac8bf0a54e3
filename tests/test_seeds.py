"""Multi-seed runs (``train --seeds``), and their statistics (``report``, ``plot --aggregate``)
checked against rliable's own functions."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import rlherd
from rlherd.cli import main
from rlherd.commands.seeds import SeedProcess, parse_seeds, wait_for_an_end
from rlherd.errors import ConfigError
from rlherd.run import statistics

ROOT = Path(__file__).resolve().parents[1]
TINY = ["ppo", "--env", "CartPole-v1", "--total-steps", "200"]
# The seeds' processes import this checkout's rlherd, as the test does.
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def rlherd_cli(args: list[str], cwd: Path, **kw) -> subprocess.Popen | subprocess.CompletedProcess:
    """``rlherd ARGS`` in a process of its own, as a user runs it."""
    command = [*kw.pop("prefix", []), sys.executable, "-m", "rlherd.cli", *args]
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    if kw.pop("background", False):
        return subprocess.Popen(command, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, **kw)  # fmt: skip
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
    for bad in ([1, 1], [2**32], [-1]):  # train_seeds' list, before any process starts
        with pytest.raises(ConfigError, match="--seeds"):
            rlherd.train_seeds("ppo", "CartPole-v1", seeds=bad, total_steps=10)


@pytest.mark.parametrize("seeds", [None, "0-1"])
def test_an_empty_run_dir_is_refused_not_the_working_directory(seeds, tmp_path, monkeypatch,
                                                                capsys):  # fmt: skip
    """``--run-dir "$RUN"`` with ``RUN`` unset is ``--run-dir ""``, which ``Path`` reads as
    ``.``: a run (or ``--seeds``' seed-K runs) was written where the command was typed."""
    monkeypatch.chdir(tmp_path)
    more = [] if seeds is None else ["--seeds", seeds, "--no-progress"]
    code = main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", "", "--total-steps", "64",
                 *more])  # fmt: skip
    assert code == 2 and "--run-dir is empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_group_notices_a_seed_that_ends_as_it_ends_not_at_its_next_look():
    """The group waits on its seeds' processes themselves, so the next seed starts (or the
    command returns) as one ends; a look every 30 s would have seen this one only at its end."""
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    long = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert wait_for_an_end([long, quick], timeout=30.0)
        assert quick.poll() is not None and long.poll() is None
    finally:
        long.kill()
        long.wait()


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


def test_seeds_into_a_parent_that_holds_their_runs_are_refused_up_front(tmp_path, capsys):
    """Each seed failed alone ("already holds a run") and the command exited 1, its group
    progress bar at 100% with the old runs' mean return."""
    (tmp_path / "seed-1").mkdir()
    (tmp_path / "seed-1" / "config.json").write_text("{}")
    code = main(["train", "ppo", "--env", "CartPole-v1", "--seeds", "1-2", "--run-dir",
                 str(tmp_path), "--total-steps", "100", "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == (f"rlherd: error: {tmp_path} already holds the runs of seed 1: "
                                 f"continue them with `rlherd train --resume {tmp_path}`, or add "
                                 "--overwrite to train them again")  # fmt: skip
    assert not (tmp_path / "seed-2").exists()


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


def test_a_seed_killed_before_it_said_anything_is_named_by_its_signal(tmp_path):
    """A seed (or bsuite id) killed by the kernel's out-of-memory killer writes nothing: its
    line must say SIGKILL and suggest memory, not a bare negative exit code."""
    seed = SeedProcess(1, tmp_path / "seed-1", [])
    seed.log.write_text("")
    seed.returncode = -signal.SIGKILL
    assert seed.last_line() == ("no output; killed by SIGKILL (out of memory? the kernel's OOM "
                                "killer sends it)")  # fmt: skip
    seed.returncode = -signal.SIGSEGV
    assert seed.last_line() == "no output; killed by SIGSEGV"
    seed.returncode = -(signal.SIGRTMIN + 3)
    assert seed.last_line() == f"no output; killed by signal {signal.SIGRTMIN + 3}"
    seed.returncode = 3
    assert seed.last_line() == "no output; exit code 3"
    seed.log.write_text("Traceback ...\nValueError: bad\n")
    assert seed.last_line() == "ValueError: bad"


@pytest.mark.parametrize("flag", [["--seed", "3"], ["--resume", "runs/x"]])
def test_seeds_refuse_seed_and_resume(flag, capsys):
    assert main(["train", *TINY, "--seeds", "1-2", *flag]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"drop {flag[0]}" in err, err


def _started_group(tmp_path: Path, seeds: str, niceness: int = 0,
                   own_session: bool = False) -> tuple[Path, subprocess.Popen]:  # fmt: skip
    """A ``train --seeds`` group of long PPO runs (under ``nice -n NICENESS``; leading a session
    of its own if ``own_session``), in the background, once its first two seeds have written
    their summaries (so each has something to checkpoint)."""
    group = tmp_path / "group"  # absolute: no other process on the machine names it
    nice = ["nice", "-n", str(niceness)] if niceness else []
    parent = rlherd_cli(["train", "ppo", "--env", "CartPole-v1", "--total-steps", "10000000",
                         "--seeds", seeds, "--jobs", "2", "--log-interval-s", "0.2",
                         "--run-dir", str(group), "--no-progress"], tmp_path,
                        background=True, prefix=nice, start_new_session=own_session)  # fmt: skip
    deadline = time.monotonic() + 120
    while not all((group / f"seed-{k}" / "summary.json").exists() for k in (1, 2)):
        if parent.poll() is not None or time.monotonic() > deadline:
            _kill_all(group, parent)
            raise AssertionError(parent.stderr.read())
        time.sleep(0.2)
    return group, parent


def test_ctrl_c_stops_every_seed_with_a_checkpoint_and_resume_continues_them(tmp_path):
    """The group forwards SIGINT once to each seed (they run in process groups of their own, out of
    reach of a terminal's Ctrl-C), each stops with a checkpoint, none is left running, and
    ``--resume PARENT`` continues all of them."""
    group, parent = _started_group(tmp_path, "1-3")
    try:
        parent.send_signal(signal.SIGINT)
        _, err = parent.communicate(timeout=120)
    finally:
        parent.kill()
    assert parent.returncode == 130, err
    assert f"rlherd train --resume {group}`" in err
    assert "seed 3 had not started" in err and f"--seeds 3 --run-dir {group}`" in err
    assert not _processes_naming(group)
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


@pytest.mark.parametrize(("end", "seeds_stopped"),
                         [("SIGKILL", False), ("SIGHUP", False), ("SIGKILL", True)])  # fmt: skip
def test_seeds_do_not_outlive_a_group_that_is_killed_or_hung_up_on(tmp_path, end, seeds_stopped):
    """A group killed outright (SIGKILL, the OOM killer) runs none of its handlers: each seed
    hears SIGTERM from the kernel (PR_SET_PDEATHSIG) and stops with a checkpoint. A closed
    terminal's SIGHUP reaches the group, which passes SIGTERM on. Seeds stopped (SIGSTOP) when
    the group dies are continued by the kernel with SIGHUP (their process groups are orphaned),
    and stop with a checkpoint too.

    The kernel continues them only when their process groups are orphaned: when the seeds' new
    parent (init, or a subreaper) is outside the group's session, as it is for a group started
    from a terminal. Under a container whose first process shares the group's session, a stopped
    seed stays stopped, as any stopped job there does; so the group here leads a session of its
    own, wherever the test runs."""
    group, parent = _started_group(tmp_path, "1-2", own_session=True)
    try:
        if seeds_stopped:
            seeds = _seeds_of(group, parent)
            for pid in seeds:
                os.kill(pid, signal.SIGSTOP)
            _wait_until_stopped(seeds)
        parent.send_signal(getattr(signal, end))
        parent.communicate(timeout=120)
        deadline = time.monotonic() + 180  # a checkpoint each, on a loaded machine
        while _processes_naming(group):
            assert time.monotonic() < deadline, "a seed outlived its group"
            time.sleep(0.2)
    finally:
        _kill_all(group, parent)
    for k in (1, 2):
        assert (group / f"seed-{k}" / "checkpoints" / "latest").exists()


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no autogroup scheduler")
def test_seeds_share_their_groups_session_and_niceness(tmp_path):
    """Linux's autogroup scheduler shares the CPU between sessions before niceness counts
    within one: a seed in a session of its own would take a whole session's share, and
    ``nice -n 19 rlherd bsuite ...`` would lower nothing. Each seed is in the group's session
    (and autogroup), at its niceness, in a process group of its own (out of a terminal's
    Ctrl-C)."""
    group, parent = _started_group(tmp_path, "1-2", niceness=7)
    try:
        seeds = _seeds_of(group, parent)
        assert len(seeds) == 2, seeds
        autogroup = Path(f"/proc/{parent.pid}/autogroup").read_text()
        for pid in seeds:
            assert Path(f"/proc/{pid}/autogroup").read_text() == autogroup
            assert os.getsid(pid) == os.getsid(parent.pid)
            assert os.getpgid(pid) not in (os.getpgid(parent.pid), os.getpgid(0))
            assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(
                os.PRIO_PROCESS, parent.pid) == min(19, os.nice(0) + 7)  # fmt: skip
    finally:
        parent.send_signal(signal.SIGINT)
        try:
            parent.communicate(timeout=120)
        finally:
            _kill_all(group, parent)


def _seeds_of(group: Path, parent: subprocess.Popen) -> list[int]:
    """The ids of the running seeds of ``group`` (its processes other than ``parent``)."""
    return [pid for pid in _processes_naming(group) if pid != parent.pid]


def _wait_until_stopped(pids: list[int]) -> None:
    """Return once every thread of each of ``pids`` is stopped. A SIGSTOP takes effect only when
    each of a process's threads next runs, a while on a loaded machine; the kernel continues a
    stopped process group orphaned by its parent's death only if it *is* stopped by then, so a
    group killed before that leaves seeds that stop a moment later, for good (as a real
    terminal's Ctrl-Z would not: its job is stopped before the user can kill anything)."""
    deadline = time.monotonic() + 60
    while not all(_stopped(pid) for pid in pids):
        assert time.monotonic() < deadline, "a seed did not stop on SIGSTOP"
        time.sleep(0.05)


def _stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (state ``T`` in ``/proc``)."""
    states = [Path(f"/proc/{pid}/task/{tid}/stat").read_text().rpartition(")")[2].split()[0]
              for tid in os.listdir(f"/proc/{pid}/task")]  # fmt: skip
    return all(state == "T" for state in states)


def _kill_all(group: Path, parent: subprocess.Popen) -> None:
    """Kill ``parent`` and whatever of ``group`` still runs (a failed test's leftovers)."""
    parent.kill()
    for pid in _processes_naming(group):
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, signal.SIGKILL)


def _processes_naming(path: Path) -> list[int]:
    """The ids of this machine's processes whose command line names ``path`` (a seed left
    running)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):  # ended meanwhile
            if str(path) in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode():
                pids.append(int(pid))
    return pids


# ------------------------------------------------------------------------------ statistics
# Final returns where the IQM (mean of the middle half) and the mean differ: one outlier seed.
RETURNS = [12.0, 15.0, 9.0, 480.0, 14.0, 11.0]


def iqm_and_mean_by_rliable(scores: np.ndarray, reps: int, seed: int):
    """rliable's IQM, mean and 95% intervals of ``scores`` (runs x tasks), called directly."""
    from rliable import library, metrics

    np.random.seed(seed)  # rliable's stratified bootstrap draws from numpy's global generator
    point, interval = library.get_interval_estimates(
        {"x": scores}, lambda s: np.array([metrics.aggregate_iqm(s), metrics.aggregate_mean(s)]),
        reps=reps)  # fmt: skip
    return point["x"], interval["x"]


def test_iqm_and_ci_are_rliables():
    state = np.random.get_state()
    got = statistics.aggregate(RETURNS, reps=300, seed=7)
    assert np.array_equal(np.random.get_state()[1], state[1])  # numpy's global RNG is put back
    point, interval = iqm_and_mean_by_rliable(np.array(RETURNS)[:, None], reps=300, seed=7)
    assert [got["iqm"].value, got["mean"].value] == list(point)
    assert [got["iqm"].low, got["mean"].low] == list(interval[0])
    assert [got["iqm"].high, got["mean"].high] == list(interval[1])
    assert got["iqm"].value == pytest.approx(13.0) and got["mean"].value == pytest.approx(90.1667,
                                                                                          abs=1e-3)
    single = statistics.aggregate([3.0])
    assert single["iqm"].value == 3.0 and single["iqm"].low is None


def test_curve_bands_are_rliables_at_each_step():
    from rliable import library, metrics

    rng = np.random.default_rng(0)
    curves = [(np.arange(0, 1001 + 10 * k, 10.0), rng.normal(size=101 + k)) for k in range(5)]
    got = statistics.aggregate_curves(curves, "iqm", points=7, reps=100, seed=1)
    assert list(got.steps) == list(np.linspace(0, 1000, 7))
    scores = np.stack([np.interp(got.steps, s, v) for s, v in curves])[:, None, :]
    np.random.seed(1)
    point, interval = library.get_interval_estimates(
        {"x": scores}, lambda s: np.array([metrics.aggregate_iqm(s[..., j]) for j in range(7)]),
        reps=100)  # fmt: skip
    assert np.array_equal(got.value, point["x"])
    assert np.array_equal(got.low, interval["x"][0]) and np.array_equal(got.high, interval["x"][1])


def make_run(path: Path, seed: int, summary: dict, returns: list[float] | None = None,
             env: str = "CartPole-v1", **config: object) -> Path:  # fmt: skip
    """A run directory as a finished run leaves it: config.json, summary.json and, given
    ``returns``, metrics/train.csv with one episode per 100 steps."""
    (path / "metrics").mkdir(parents=True)
    record = dict(agent="ppo", env=env, runtime="single", seed=seed, total_steps=1000,
                  env_kwargs={}, eval_every=0, eval_episodes=10,
                  config={"learning_rate": 3e-4, **config}, settings={"torch_threads": 1},
                  preset="classic", machine={"cores": seed})  # fmt: skip
    (path / "config.json").write_text(json.dumps(record))
    if summary:
        (path / "summary.json").write_text(json.dumps({"agent": "ppo", **summary}))
    if returns is not None:
        with open(path / "metrics" / "train.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["actor_steps", "episode_return"])
            writer.writerows([(100 * (i + 1), r) for i, r in enumerate(returns)])
    return path


@pytest.fixture
def experiments(tmp_path, monkeypatch):
    """runs/a: 6 seeds that evaluated; runs/b: 3 seeds of another learning rate that did not,
    and one that has no episode yet; runs/game: one run of a game of two policies."""
    monkeypatch.chdir(tmp_path)
    for k, value in enumerate(RETURNS, 1):
        make_run(tmp_path / "runs" / "a" / f"seed-{k}", k,
                 {"final_return_mean": value - 1, "eval_return_mean": value},
                 returns=[value * i / 10 for i in range(10)])  # fmt: skip
    for k in (1, 2, 3):
        make_run(tmp_path / "runs" / "b" / f"seed-{k}", k, {"final_return_mean": 20.0 * k},
                 returns=[20.0 * k] * 10, learning_rate=1e-3)  # fmt: skip
    make_run(tmp_path / "runs" / "b" / "seed-4", 4, {}, learning_rate=1e-3)
    make_run(tmp_path / "runs" / "game", 0, {"final_return_mean": None,
                                             "final_return_mean_tagger": 5.0,
                                             "final_return_mean_runner": -5.0},
             env="tag-gridworld")  # fmt: skip
    return tmp_path / "runs"


def test_report_has_one_row_per_experiment_and_policy(experiments, capsys):
    assert main(["report", "runs/a", "runs/b", "runs/game", "--json", "--reps", "300"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["group"], r["policy"], r["runs"], r["return"]) for r in rows] == [
        ("runs/a", None, 6, "eval_return_mean"),
        ("runs/b", None, 3, "final_return_mean"),
        ("runs/game", "runner", 1, "final_return_mean_runner"),
        ("runs/game", "tagger", 1, "final_return_mean_tagger"),
    ]
    a, b, runner, _ = rows
    assert a["seeds"] == [1, 2, 3, 4, 5, 6] and a["returns"] == RETURNS
    (iqm, mean), interval = iqm_and_mean_by_rliable(np.array(RETURNS)[:, None], 300,
                                                   statistics.BOOTSTRAP_SEED)  # fmt: skip
    assert (a["iqm"], a["mean"]) == (iqm, mean)
    assert a["iqm_ci"] == [interval[0][0], interval[1][0]]
    assert b["left_out"] == ["runs/b/seed-4"] and b["mean"] == pytest.approx(40.0)
    assert runner["iqm"] == -5.0 and runner["iqm_ci"] is None


def test_report_prints_a_table(experiments, capsys):
    assert main(["report", "runs", "--reps", "100"]) == 0
    out = capsys.readouterr().out
    for text in ("runs/a", "runs/b", "runs/game", "tagger", "eval", "train", "n/a",
                 "left out of runs/b (no episode finished yet): runs/b/seed-4"):  # fmt: skip
        assert text in out, text


def test_report_tells_apart_experiments_that_share_a_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for k, rate in enumerate([3e-4, 1e-3, 3e-4, 1e-3]):
        make_run(tmp_path / "mixed" / f"run-{k}", k, {"final_return_mean": k},
                 learning_rate=rate)  # fmt: skip
    assert main(["report", "mixed", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["group"], r["seeds"]) for r in rows] == [
        ("mixed (learning_rate=0.0003)", [0, 2]), ("mixed (learning_rate=0.001)", [1, 3])]


def test_packages_are_not_counted_as_seeds_and_a_run_given_twice_is_one(experiments, capsys):
    """A package (rlherd package) holds a copy of its run's config.json: in a folder of runs it
    was counted as one more seed of the run it came from."""
    for k in (1, 2):  # two packages of one seed of runs/b, as `rlherd package -o` leaves them
        package = experiments / "b" / f"package-{k}"
        package.mkdir()
        record = json.loads((experiments / "b" / "seed-1" / "config.json").read_text())
        (package / "config.json").write_text(json.dumps({**record, "package": {"step": 1}}))
        (package / "summary.json").write_text((experiments / "b" / "seed-1" /
                                                "summary.json").read_text())  # fmt: skip
    assert main(["report", "runs/b", "runs/b/seed-2", "--json", "--reps", "50"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["seeds"] == [1, 2, 3] and row["returns"] == [20.0, 40.0, 60.0]
    assert main(["report", "runs/b/package-1"]) == 2
    assert "runs/b/package-1 is a package" in capsys.readouterr().err
    # plot draws a run given twice once (it drew it twice).
    from rlherd.run.statistics import find_runs

    assert len(find_runs(["runs/a/seed-1", "runs/a", "runs/a/seed-1/../seed-1"])) == 6


def test_report_without_rliable_names_the_extra(experiments, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rliable", None)  # import rliable: ImportError
    assert main(["report", "runs/a"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith('pip install "rlherd[stats]"'), line


def test_a_folder_of_seed_runs_given_for_one_run_names_them(experiments, capsys):
    """``rlherd eval runs/a`` after ``--seeds``: the folder holds the runs, and the error said
    only that it is not a run directory. It names the runs it holds and how to give one."""
    for command in ("eval", "export"):
        assert main([command, "runs/a"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert "it holds runs (seed-1, seed-2, seed-3, ...): give one, e.g. runs/a/seed-1" in err


def test_plot_to_a_name_ending_in_a_slash_draws_in_that_folder(experiments, capsys):
    """``-o figures/`` names a folder, made for ``curves.png``; ``Path`` drops the slash, so the
    figure was written as ``figures.png`` beside it."""
    assert main(["plot", "runs/a", "-o", "figures/"]) == 0
    assert capsys.readouterr().out.strip() == str(Path("figures") / "curves.png")
    assert (experiments.parent / "figures" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert not (experiments.parent / "figures.png").exists()


def test_plot_aggregate_of_runs_without_an_episode_is_one_line(experiments, capsys):
    """Runs that have finished no episode yet (no metrics/train.csv): ``plot --aggregate``
    wrote an empty figure (and matplotlib's warning of a legend without labels) and exited 0,
    where ``plot`` without it refuses in one line. It refuses too, and writes nothing."""
    image = experiments / "none.png"
    assert main(["plot", "runs/b/seed-4", "--aggregate", "iqm", "-o", str(image)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has finished an episode yet" in err, err
    assert not image.exists()


@pytest.mark.parametrize("kind", ["iqm", "mean"])
def test_plot_aggregate_writes_an_image(experiments, kind, capsys):
    image = experiments / f"{kind}.png"
    assert main(["plot", "runs/a", "runs/b", "--aggregate", kind, "--reps", "50",
                 "-o", str(image)]) == 0  # fmt: skip
    assert image.stat().st_size > 1000
