"""A learner that blew up with finite numbers stops the run."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import rlherd
from rlherd.run import divergence
from rlherd.run.config import TrainingDiverged
from rlherd.run.divergence import LOSS_WARMUP, DivergenceWatch
from rlherd.run.rundir import RunDir

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------ the detector
def _feed(watch: DivergenceWatch, losses: list[float], norms: list[float] | None = None):
    """Readings of one value loss (and the parameters' norm, 10 unless given), one per check."""
    norms = norms or [10.0] * len(losses)
    for i, (loss, norm) in enumerate(zip(losses, norms, strict=True)):
        watch.observe((i + 1) * divergence.CHECK_PERIOD, norm, {"value_loss": torch.tensor(loss)})


def test_a_value_loss_growing_with_the_returns_does_not_trip():
    """A CartPole-like value loss: 0.5 at first, rising 200x as returns grow, with one batch in
    twenty 30x its neighbours; the weights drift up 13x."""
    rng = np.random.default_rng(0)
    steps = 2_000
    growth = np.geomspace(0.5, 100.0, steps) * rng.lognormal(0.0, 0.5, steps)
    growth[::20] *= 30.0
    norms = list(np.geomspace(10.0, 130.0, steps))
    _feed(DivergenceWatch(initial_norm=10.0), list(growth), norms)  # raises if it trips


def test_a_loss_a_million_times_its_early_size_trips_after_a_few_readings():
    watch = DivergenceWatch(initial_norm=10.0)
    early = [1.0, 2.0, 0.5] + [1.0] * (LOSS_WARMUP - 3)
    _feed(watch, early)
    for i in range(divergence.LOSS_PATIENCE - 1):  # a spike, or the start of a blow-up
        watch.observe(1_000 + i, 10.0, {"value_loss": 2e6})
    with pytest.raises(TrainingDiverged, match=r"learner step 1002: value_loss reached 2e\+06, "
                                               r"1e\+06x its early size \(2\).*learning_rate"):
        watch.observe(1_002, 10.0, {"value_loss": 2e6})


def test_one_spike_of_a_loss_does_not_trip():
    watch = DivergenceWatch(initial_norm=10.0)
    _feed(watch, [1.0] * LOSS_WARMUP + [1e7] * (divergence.LOSS_PATIENCE - 1) + [1.0] * 5)


def test_parameters_far_beyond_their_start_trip_at_once():
    watch = DivergenceWatch(initial_norm=8.0)
    watch.observe(10, 8.0 * 900, {})  # under the factor: a long healthy run's drift, and more
    with pytest.raises(TrainingDiverged, match=r"learner step 20: the parameters' norm reached "
                                               r"8e\+04, 1e\+04x its value before the first "
                                               r"update \(8\)"):
        watch.observe(20, 8.0 * 1e4, {})


def test_non_finite_and_non_loss_metrics_are_left_to_the_finiteness_checks():
    watch = DivergenceWatch(initial_norm=10.0)
    _feed(watch, [1.0] * LOSS_WARMUP + [math.nan] * 5)
    watch.observe(500, 10.0, {"grad_norm": 1e12, "td_abs_mean": 1e12, "reconnects": 10**9})


# ------------------------------------------------------------------------------ runs
@pytest.mark.parametrize("agent, total_steps", [("dqn", 6_000), ("ppo", 12_000)])
def test_a_learner_blown_up_with_finite_numbers_stops_the_run(agent, total_steps, tmp_path):
    """learning_rate=1e6: Adam moves every weight by about 1e6 per step, so the weights reach
    1e8-1e10 while staying finite, and the run used to finish with a return of about 9 (the
    budgets here cover the detector's first readings, 10 learner steps, and more). It stops
    instead, and no checkpoint (here one at every step) holds the blown-up weights."""
    with pytest.raises(TrainingDiverged, match=r"learner step \d+: the parameters' norm reached"):
        rlherd.train(agent, "CartPole-v1", total_steps=total_steps, learning_rate=1e6, seed=0,
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
