"""Faults said as they happen: a learner that blew up with finite numbers stops the run, a
replaced mono actor and a poly server out and back each get one line on stderr."""

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import hold_run_until, hold_until_restarts, kill_an_actor
from test_poly import _server_pids  # environment servers this process started

import rlherd
from rlherd.errors import TrainingDiverged
from rlherd.run import divergence
from rlherd.run.divergence import LOSS_WARMUP, DivergenceWatch
from rlherd.run.rundir import RunDir
from rlherd.runtime import poly

REPO = Path(__file__).resolve().parents[1]
KILLED = r"killed by SIGKILL \(out of memory\? the kernel's OOM killer sends it\)"


# ------------------------------------------------------------------------------ the detector
def _feed(watch: DivergenceWatch, losses: list[float], norms: list[float] | None = None):
    """Readings of one value loss (and the parameters' norm, 10 unless given), one per check."""
    norms = norms or [10.0] * len(losses)
    for i, (loss, norm) in enumerate(zip(losses, norms, strict=True)):
        watch.observe((i + 1) * divergence.CHECK_PERIOD, norm, {"value_loss": torch.tensor(loss)})


def test_a_value_loss_growing_with_the_returns_does_not_trip():
    """A CartPole-like value loss: about 0.5 at first, rising 200x as returns grow, with one
    batch in twenty 30x its neighbours; the weights drift up 13x."""
    rng = np.random.default_rng(0)
    steps = 2_000
    growth = np.geomspace(0.5, 100.0, steps) * rng.lognormal(0.0, 0.5, steps)
    growth[15::20] *= 30.0
    norms = list(np.geomspace(10.0, 130.0, steps))
    _feed(DivergenceWatch(initial_norm=10.0), list(growth), norms)  # raises if it trips


def test_a_loss_a_million_times_its_early_size_trips_after_a_few_readings():
    watch = DivergenceWatch(initial_norm=10.0)
    _feed(watch, [1.0, 2.0, 0.5] + [1.0] * (LOSS_WARMUP - 3))
    watch.observe(1_000, 10.0, {"value_loss": 2e6})  # a spike, or the start of a blow-up
    watch.observe(1_010, 10.0, {"value_loss": 2e6})
    said = r"learner step 1020: value_loss reached 2e\+06, 1e\+06x its early size \(2\)"
    with pytest.raises(TrainingDiverged, match=said + ".*learning_rate"):
        watch.observe(1_020, 10.0, {"value_loss": 2e6})


def test_one_spike_of_a_loss_does_not_trip():
    watch = DivergenceWatch(initial_norm=10.0)
    _feed(watch, [1.0] * LOSS_WARMUP + [1e7, 1.0, 1e7, 1.0, 1e7, 1e7, 1.0])


def test_parameters_far_beyond_their_start_trip_at_once():
    watch = DivergenceWatch(initial_norm=8.0)
    watch.observe(10, 8.0 * 900, {})  # under the factor: a long healthy run's drift, and more
    said = r"learner step 20: the parameters' norm reached 8e\+04, 1e\+04x its value before"
    with pytest.raises(TrainingDiverged, match=said + r" the first update \(8\)"):
        watch.observe(20, 8.0 * 1e4, {})


def test_only_losses_are_watched_and_non_finite_readings_do_not_blind_the_watch():
    """Gradient norms and TD errors are not losses (they may legitimately start tiny); an
    infinite early loss (the finiteness checks' to report) does not become the reference."""
    watch = DivergenceWatch(initial_norm=10.0)
    for step in range(1, 40):
        watch.observe(step, 10.0, {"grad_norm": 1e-3 if step <= 15 else 1e12,
                                   "td_abs_mean": 1e-3 if step <= 15 else 1e12})  # fmt: skip
    _feed(watch, [math.inf] + [1.0] * LOSS_WARMUP)
    with pytest.raises(TrainingDiverged, match="value_loss reached 1e\\+07"):
        _feed(watch, [1e7] * 3)


# ------------------------------------------------------------------------------ runs
@pytest.mark.parametrize("agent, total_steps", [("dqn", 6_000), ("ppo", 40_000)])
def test_a_learner_blown_up_with_finite_numbers_stops_the_run(agent, total_steps, tmp_path):
    """learning_rate=1e6: Adam moves every weight by about 1e6 per step, so the weights reach
    1e8-1e10 while staying finite, and the run used to finish with a return of about 9. It
    stops at the watch's first reading (the budgets cover 100 learner steps and more)."""
    with pytest.raises(TrainingDiverged, match=r"learner step 100: the parameters' norm reached"):
        rlherd.train(agent, "CartPole-v1", total_steps=total_steps, learning_rate=1e6, seed=0,
                     run_dir=tmp_path, progress=False)  # fmt: skip


def test_no_checkpoint_holds_a_learner_that_blew_up(tmp_path):
    """A checkpoint at every step: the first one after the learner blew up, between two of the
    watch's readings, stops the run instead of being written."""
    with pytest.raises(TrainingDiverged, match=r"learner step \d+: the parameters' norm reached"):
        rlherd.train("dqn", "CartPole-v1", total_steps=6_000, learning_rate=1e6, seed=0,
                     run_dir=tmp_path, progress=False, checkpoint_interval_s=0.0)  # fmt: skip
    state = RunDir(tmp_path).load_checkpoint()
    weights = [t for t in state["learner"]["net"].values() if t.is_floating_point()]
    assert weights and max(float(t.abs().max()) for t in weights) < 100.0


def test_the_command_line_says_so_in_one_line_and_exits_2(tmp_path):
    cmd = [sys.executable, "-m", "rlherd.cli", "train", "dqn", "--env", "CartPole-v1",
           "--set", "learning_rate=1e6", "--total-steps", "6000", "--no-progress",
           "--run-dir", str(tmp_path / "run")]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("rlherd: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert re.search(r"learner step \d+: the parameters' norm reached .*x its value before the "
                     r"first update .*learning_rate", errors[0]), errors[0]  # fmt: skip


# ------------------------------------------------------------------------------ said at once
def _said(text: str, pattern: str) -> list[str]:
    return [line for line in text.splitlines() if re.fullmatch(pattern, line)]


def test_a_replaced_mono_actor_is_said_on_stderr_when_it_happens(tmp_path, capfd, monkeypatch):
    """SIGKILL one actor once: one line says so while the run goes on, not only the count in
    summary.json at the end."""
    hold_until_restarts(monkeypatch, 1)
    result = {}
    run = threading.Thread(target=lambda: result.update(run=rlherd.train(
        "impala", "CartPole-v1", runtime="mono", total_steps=16_000, run_dir=tmp_path,
        progress=False, num_actors=2)))  # fmt: skip
    run.start()
    kill_an_actor()
    run.join(timeout=300)
    assert not run.is_alive(), "the run hung after its actor was killed"
    assert result["run"].summary["actor_restarts"] == 1
    lines = _said(
        capfd.readouterr().err,
        r"rlherd: actor [01] died, " + KILLED + r"; restarted \(restart 1 of at most 40\)",
    )
    assert len(lines) == 1


def test_a_poly_server_outage_is_said_when_it_starts_and_when_it_ends(tmp_path, capfd, monkeypatch):
    """SIGKILL one of two local environment servers while the learner learns: one line when it
    goes (whichever notices first, its streams or the restart), one when a stream reaches it
    again, however many of the four actors' streams it served. The server is back within about
    a second (1,800 steps on a loaded machine), so 20,000 steps outlast it ten times over; the
    run is held past its budget until the second line is said, so no machine's speed ends the
    run before it."""
    said, say_now = [], poly.say

    def say(message: str) -> None:
        said.append(message)
        say_now(message)

    monkeypatch.setattr("rlherd.runtime.poly.say", say)
    hold_run_until(monkeypatch, lambda recorder: any("answers again" in m for m in said),
                   timeout_s=60)  # fmt: skip
    victims = []

    def kill_one():
        deadline = time.monotonic() + 60
        while not victims and time.monotonic() < deadline:
            pids = _server_pids()
            if len(pids) == 2 and (tmp_path / "metrics" / "learner.csv").exists():
                os.kill(pids[0], signal.SIGKILL)
                victims.append(pids[0])
            time.sleep(0.1)

    killer = threading.Thread(target=kill_one)
    killer.start()
    run = rlherd.train("impala", "rlherd/Corridor-v0", runtime="poly", total_steps=20_000, seed=0,
                       run_dir=tmp_path, progress=False, num_servers=2, num_actors=4,
                       log_interval_s=0.5)  # fmt: skip
    killer.join()
    assert victims, "no server was killed"
    assert run.summary["server_restarts"] == 1
    err = capfd.readouterr().err
    server = r"rlherd: environment server unix:\S+env-\d\.sock"
    why = r"ended, " + KILLED + r"; restarting it|does not answer \(.*\); retrying"
    went = _said(err, f"{server} ({why})")
    back = _said(err, server + r" answers again, after \d+\.\ds")
    assert len(went) == 1 and len(back) == 1, err
    assert went[0].split()[3] == back[0].split()[3]  # the same server
