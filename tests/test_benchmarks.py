"""The benchmarks' own stand-ins for old code paths still run against today's classes."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from rlherd.replay import Prioritized

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_learner_steps_old_sum_tree_samples_as_todays_prioritized_replay():
    """``before``'s sum-tree subclasses Prioritized: every method a table calls (insert,
    delete, update, sample) must be the tree's own, and give today's probabilities."""
    trees = [load("learner_step").SumTree(0.5), Prioritized(0.5)]
    priorities = np.array([1.0, 4.0, 0.0, 9.0, 16.0, 2.0])
    for selector in trees:
        selector.reset(100)
        for slot, p in enumerate(priorities):
            selector.insert(slot, slot, p)
        selector.delete(5)
        selector.update(np.array([0, 1]), np.array([25.0, 4.0]))
    expected = np.array([5.0, 2.0, 0.0, 3.0, 4.0]) / 14.0
    for selector in trees:
        slots, probabilities = selector.sample(2_000, np.random.default_rng(0))
        assert set(slots.tolist()) == {0, 1, 3, 4}
        np.testing.assert_allclose(probabilities, expected[slots])


def test_sac_td3_updates_drives_todays_learners():
    """benchmarks/sac_td3_updates.py's rlherd path: its table (a fixed dataset, no rate limit)
    feeds SAC's and TD3's learners as a run does. (Its Stable-Baselines3 path needs the bench
    extra, which the test install leaves out.)"""
    bench = load("sac_td3_updates")
    data = bench.random_transitions("Pendulum-v1", 600)
    for agent in ("sac", "td3"):
        bench.rlherd_updates(agent, "Pendulum-v1", data)(3)


def test_actor_scaling_reads_the_first_step_its_moving_mean_reaches_the_target(tmp_path):
    """Time-to-return is where the mean of the last ``window`` episodes first reaches the
    target, not where one lucky episode does, and is the learner's walltime there (from its
    first step), not the run's, which counts Ray's start."""
    bench = load("actor_scaling")
    (tmp_path / "metrics").mkdir()
    rows = [(200, -1000.0, 11.0), (400, -100.0, 12.0), (600, -900.0, 13.0), (800, -100.0, 14.0),
            (1000, -100.0, 15.0)]  # fmt: skip
    lines = ["actor_steps,episode_return,episode_length,sps,wall_time_s"]
    lines += [f"{n},{r},200,100.0,{t}" for n, r, t in rows]
    (tmp_path / "metrics" / "train.csv").write_text("\n".join(lines) + "\n")
    learner = "learner_steps,actor_steps,learner_walltime\n10,300,0.5\n50,700,2.5\n90,1000,4.0\n"
    (tmp_path / "metrics" / "learner.csv").write_text(learner)
    c = bench.curve(tmp_path, window=2)
    np.testing.assert_allclose(c["returns"], [-1000.0, -550.0, -500.0, -500.0, -100.0])
    np.testing.assert_allclose(c["seconds"], [0.0, 1.0, 2.0, 3.0, 4.0])
    assert bench.reached(c, -500.0) == (600, 2.0)
    assert bench.reached(c, -50.0) == (None, None)


def test_actor_scaling_compares_each_seed_with_itself():
    """The speed-up is each seed's ratio of times, over the seeds where both settings reached
    the target: a seed that only one setting brought there is not compared."""
    bench = load("actor_scaling")

    def run(*returns):  # one episode a second of the learner's walltime
        seconds = np.arange(1.0, len(returns) + 1)
        return dict(steps=seconds * 200, seconds=seconds, returns=np.array(returns, float))

    first = [9.0, None, 8.0]  # 1 actor: seeds 0 and 2 reached it at 9 s and 8 s
    runs = [run(-900, -300), run(-300), run(-900, -900, -900, -300)]  # at 2 s, 1 s and 4 s
    row = bench.setting_row("6", 4, runs, -400.0, first)
    assert row["seeds_reaching_target"] == 3 and row["seeds_compared"] == 2
    assert row["speedup_vs_first_mean"] == 3.25  # (9 / 2 + 8 / 4) / 2
    assert row["speedup_vs_first_range"] == [2.0, 4.5]


def test_actor_scaling_reads_a_learner_log_of_one_row(tmp_path):
    """A short run's learner may log once: its walltime is still read (not a 0-d array that
    interpolation refuses)."""
    bench = load("actor_scaling")
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "train.csv").write_text(
        "actor_steps,episode_return,episode_length,sps,wall_time_s\n200,-900.0,200,100.0,1.0\n"
    )
    (tmp_path / "metrics" / "learner.csv").write_text(
        "learner_steps,actor_steps,learner_walltime\n10,300,0.5\n"
    )
    np.testing.assert_allclose(bench.curve(tmp_path, window=2)["seconds"], [0.0])


def test_bsuite_figures_judges_claims_only_on_scores_bsuite_gave():
    """An agent that did not run an experiment has NaN there in bsuite's table: its JSON lines
    say null (NaN is not JSON), and no claim is judged against it (r2d2 above a missing dqn
    read False; the missing mcts made "mcts at the top" False), nor a claim with nobody to
    compare against (dqfd above a missing dqn and r2d2)."""
    import math

    import pandas as pd

    figures = load("bsuite_figures")
    table = pd.DataFrame(
        {"dqn": [math.nan, 0.2, 0.0], "r2d2": [0.7, 0.6, 0.0], "mcts": [math.nan, math.nan, 1.0]},
        index=["memory_len", "memory_size", "deep_sea"],
    )
    claims = figures.claims("10", table)
    assert [c["claim"] for c in claims] == ["r2d2 above dqn on memory_size",
                                            "mcts at the top on deep_sea"]  # fmt: skip
    assert [c["holds"] for c in claims] == [True, True]
    line = json.dumps(figures.scores(table.loc["memory_len"]), allow_nan=False)
    assert json.loads(line) == {"dqn": None, "r2d2": 0.7, "mcts": None}
    table.loc["deep_sea", "mcts"] = math.nan
    assert [c["claim"] for c in figures.claims("10", table)] == ["r2d2 above dqn on memory_size"]
    table.loc["deep_sea", ["dqn", "r2d2"]] = math.nan, math.nan
    table.loc["deep_sea", "mcts"] = 1.0
    assert [c["claim"] for c in figures.claims("10", table)] == ["r2d2 above dqn on memory_size"]
    eleven = pd.DataFrame({"dqn": [math.nan, 0.0], "r2d2": [math.nan, 0.2], "dqfd": [0.5, 0.4]},
                          index=["deep_sea", "deep_sea_stochastic"])  # fmt: skip
    assert [(c["claim"], c["holds"]) for c in figures.claims("11", eleven)] == [
        ("dqfd solves deep_sea_stochastic ids dqn and r2d2 do not", True)]


def test_bsuite_figures_finished_ids_are_those_that_played_their_budget(tmp_path):
    """What a sweep's JSON line counts as finished (``finished_now``): an id begun and not
    finished (its summary short of its budget) is not."""
    from rlherd.commands import bsuite as sweeps

    figures = load("bsuite_figures")
    first = tmp_path / "first"
    sweeps.sweep("dqn", ["bsuite/catch/0"], first, progress=False, total_episodes=3)
    begun = first / "catch-1"
    shutil.copytree(first / "catch-0", begun)
    (begun / "summary.json").write_text('{"episodes": 1, "total_episodes": 3}')
    assert figures.finished_ids(first, ["bsuite/catch/0", "bsuite/catch/1"]) == ["bsuite/catch/0"]


@pytest.mark.parametrize("flags, named", [
    (["--seeds", "-1"], "--seeds must be a whole number"),
    (["--steps", "0"], "--steps must be at least"),
    (["--steps", "1", "--action-repeat", "2"], "--steps must be at least the action repeat (2)"),
    (["--action-repeat", "0"], "--action-repeat must be at least 1"),
    (["--eval-episodes", "0"], "--eval-episodes must be at least 1"),
    (["--tasks", "dm_control/walker-walkk-v0"], "Did you mean: dm_control/walker-walk-v0"),
    (["--agents", "sacc"], "unknown agent 'sacc'"),
    (["--seeds", "0", "1", "0"], "--seeds names 0 more than once"),
    (["--agents", "sac", "sac"], "--agents names sac more than once"),
    (["--tasks", "Pendulum-v1", "CartPole-v1"], "CartPole-v1 has discrete actions"),
])  # fmt: skip
def test_control_suite_refuses_bad_flags_in_one_line_before_any_run(
    flags, named, tmp_path, monkeypatch, capsys
):
    """Each bad flag is one usage error naming it, before anything trains (the last task of
    the list too), not a traceback from inside ``rlherd train`` after the earlier runs."""
    bench = load("control_suite")
    out = tmp_path / "runs"
    argv = ["control_suite.py", "--steps", "4", "--agents", "sac", "--tasks", "Pendulum-v1",
            "--out", str(out), *flags]  # fmt: skip
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit) as stopped:
        bench.main()
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("control_suite.py: error: ") and named in error
    assert not out.exists()


@pytest.mark.parametrize("script, flags", [
    ("control_suite", ["--agents", "sac", "--tasks", "Pendulum-v1", "--alternative"]),
    ("continuous_control", ["--agents", "td3", "--envs", "Pendulum-v1", "--alternative",
                            "preset"]),
])  # fmt: skip
def test_an_alternative_without_stable_baselines3_is_one_line(script, flags, tmp_path,
                                                             monkeypatch, capsys):  # fmt: skip
    """``--alternative`` without the bench extra names the extra before rlherd's runs train,
    not as an ImportError once their hours have passed."""
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)  # as if not installed
    monkeypatch.setattr("sys.argv", [f"{script}.py", "--steps", "4", *flags,
                                     "--out", str(tmp_path / "runs")])  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        load(script).main()
    assert stopped.value.code == 2
    assert "pip install 'rlherd[bench]'" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("script, args, run", [
    ("control_suite", ("sac", "Pendulum-v1", 4, 1, 0), "sac-Pendulum-v1-ar1-seed0"),
    ("continuous_control", ("td3", "Pendulum-v1", 4, 0), "td3-Pendulum-v1-seed0"),
])  # fmt: skip
def test_benchmark_rows_give_the_machine_their_run_trained_on(script, args, run, tmp_path):
    """A row's steps/s and wall time are its run's, so its machine is too (one intra-op
    thread), also for a finished run that a later call reuses from ``--out`` in a process of
    other threads, and not this script's at its start."""
    import torch

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        bench = load(script)
        first = bench.score(*args, tmp_path, 1)
        torch.set_num_threads(threads + 1)
        again = bench.score(*args, tmp_path, 1)  # reused, not trained
    finally:
        torch.set_num_threads(threads)
    summary = json.loads((tmp_path / run / "summary.json").read_text())
    assert first["machine"] == again["machine"] == summary["machine"]
    assert again["machine"]["torch_threads"] == 1
