"""``rlherd tune``: a sweep of PPO on CartPole finishes with its trials as run directories and a
best config that ``rlherd train --config`` trains; a trial clearly worse than the finished ones
is pruned, as a run stopped by its callback; bad input is one line."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlherd.agents import BUILDERS
from rlherd.cli import main
from rlherd.commands.tune import SPACES, load_space
from rlherd.config import apply_overrides

ROOT = Path(__file__).resolve().parents[1]
# Tiny trials: 2,000 steps of PPO on CartPole (8 x 16 or 32 steps per update), four evaluations
# of two episodes each.
TINY = ["--env", "CartPole-v1", "--total-steps", "2000", "--eval-every", "500",
        "--eval-episodes", "2"]  # fmt: skip


def _rows(study: Path) -> list[dict[str, str]]:
    with open(study / "trials.csv") as f:
        return list(csv.DictReader(f))


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_each_evaluation_is_reported_at_a_step_of_its_own():
    """The final policy's evaluation of a budget that is no multiple of eval_every (25,000 of
    10,000s) fell on the step of the one before (2), which Optuna keeps the first value of: the
    pruner never saw it. It is reported at the next step; the objective counts it."""
    from rlherd.commands.tune import ReportEvaluations

    class Trial:
        def __init__(self):
            self.reported = {}

        def report(self, value, step):
            assert step not in self.reported, f"step {step} reported twice"
            self.reported[step] = value

        def should_prune(self):
            return False

    trial = Trial()
    report = ReportEvaluations(trial, 10_000, "auc")
    for steps, ret in ((10_000, 1.0), (20_003, 2.0), (25_001, 6.0)):
        report.on_eval({"actor_steps": steps, "eval_return_mean": ret})
    assert trial.reported == {1: 1.0, 2: 1.5, 3: 3.0} and report.value() == 3.0


def test_four_trials_on_two_workers_finish_and_the_best_config_trains(tmp_path, capfd):
    """Two worker processes share the study's SQLite storage; every trial is an ordinary run
    directory; ``best.yaml`` is a ``--config`` file whose values reach the new run's config."""
    # The built-in space with shorter rollouts and fewer epochs, so that each trial takes
    # seconds: the file replaces these fields and keeps the rest of PPO's space.
    space = _write(tmp_path / "space.yaml", {"unroll_length": ["categorical", [16, 32]],
                                             "epochs": ["categorical", [2, 4]],
                                             "hidden_sizes": None})  # fmt: skip
    study = tmp_path / "study"
    code = main(["tune", "ppo", *TINY, "--trials", "4", "--jobs", "2", "--space", str(space),
                 "--out", str(study), "--startup-trials", "2"])  # fmt: skip
    out = capfd.readouterr()  # the workers' lines too, from their processes
    assert code == 0, out.err
    summary = json.loads(out.out.strip().splitlines()[-1])
    rows = _rows(study)
    assert [int(r["number"]) for r in rows] == [0, 1, 2, 3]
    assert {r["state"] for r in rows} <= {"COMPLETE", "PRUNED"} and summary["trials"] == 4
    assert sum(line.startswith("trial ") for line in out.err.splitlines()) == 4, out.err
    searched = set(load_space("ppo", space))
    assert "hidden_sizes" not in searched and set(rows[0]) >= searched
    for row in rows:  # each trial a normal run, with the values the table says
        record = json.loads((Path(row["run_dir"]) / "config.json").read_text())
        assert Path(row["run_dir"]).parent == study and (Path(row["run_dir"]) /
                                                          "summary.json").exists()
        assert record["config"]["unroll_length"] == int(row["unroll_length"])
        assert record["config"]["learning_rate"] == pytest.approx(float(row["learning_rate"]))
    best = yaml.safe_load((study / "best.yaml").read_text())
    assert best["agent"] == "ppo" and best["env"] == "CartPole-v1"
    assert set(best["config"]) == searched and best["config"] == summary["best_config"]
    assert (study / "importance.png").stat().st_size > 0
    # The best config trains as it is written.
    run_dir = tmp_path / "best-run"
    code = main(["train", "--config", str(study / "best.yaml"), "--total-steps", "200",
                 "--run-dir", str(run_dir), "--no-progress"])  # fmt: skip
    assert code == 0, capfd.readouterr().err
    trained = json.loads((run_dir / "config.json").read_text())["config"]
    for field, value in best["config"].items():
        assert trained[field] == pytest.approx(value), field


def test_a_workers_notices_are_one_line_as_the_commands_are(tmp_path, capfd):
    """A worker (with --jobs 2) is a spawned process, which starts with Python's warning format:
    it sets the command's, so a notice (MiniGrid's mission left out) is not printed with
    rlherd's source."""
    code = main(["tune", "ppo", "--env", "MiniGrid-Empty-5x5-v0", "--total-steps", "256",
                 "--eval-every", "256", "--eval-episodes", "1", "--trials", "2", "--jobs", "2",
                 "--out", str(tmp_path / "study")])  # fmt: skip
    err = capfd.readouterr().err
    assert code == 0, err
    assert "rlherd: minigrid:MiniGrid-Empty-5x5-v0: left out of the observation: mission" in err
    assert "ObservationNotice" not in err and "run = train(" not in err, err


def test_a_bad_space_gets_its_trial_pruned_and_the_study_continues(tmp_path, capsys):
    """A study of one finished trial at a working learning rate, continued (the same
    storage) with a space whose learning rates cannot move the policy: the new trial's
    evaluations stay below the finished trial's at the same point, so the median pruner (one
    trial to compare with, no warm-up) stops its run, whose summary says so.

    Seed 2: there the untrained policy falls at once (8.5 steps) and 1e-3 is past 100 at the
    first evaluation; at seed 0 the untrained greedy policy happens to balance for 378 steps."""
    study = tmp_path / "study"
    only_lr = {name: None for name in SPACES["ppo"]}  # the rest at the CartPole preset's values
    sessions = [("good", ["log_float", 1e-3, 1e-3]), ("bad", ["log_float", 1e-9, 1e-8])]
    for name, rates in sessions:
        space = _write(tmp_path / f"{name}.yaml", {**only_lr, "learning_rate": rates})
        code = main(["tune", "ppo", *TINY, "--trials", "1", "--space", str(space), "--out",
                     str(study), "--seed", "2", "--startup-trials", "1", "--warmup-evals", "0",
                     "--set", "unroll_length=32"])  # fmt: skip
        assert code == 0, capsys.readouterr().err
    good, bad = _rows(study)
    assert good["state"] == "COMPLETE" and bad["state"] == "PRUNED", (good, bad)
    assert "median pruner" in bad["note"] and float(bad["learning_rate"]) < 1e-7
    summary = json.loads((Path(bad["run_dir"]) / "summary.json").read_text())
    assert summary["stopped_by"].startswith("ReportEvaluations: Optuna's median pruner")
    assert summary["actor_steps"] < 2000  # stopped early
    best = yaml.safe_load((study / "best.yaml").read_text())
    assert best["config"] == {"learning_rate": 1e-3, "unroll_length": 32}


def _error(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    return err


def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch):
    out = ["--out", str(tmp_path / "study")]
    space = _write(tmp_path / "space.yaml", {"learning_rat": ["log_float", 1e-5, 1e-3]})
    err = _error(capsys, ["tune", "ppo", *TINY, "--trials", "1", "--space", str(space), *out])
    assert "'learning_rat' is not a field of PPOConfig (did you mean learning_rate?)" in err
    space = _write(tmp_path / "space.yaml", {"learning_rate": ["log", 1e-5, 1e-3]})
    err = _error(capsys, ["tune", "ppo", *TINY, "--trials", "1", "--space", str(space), *out])
    assert "KIND one of float, log_float" in err
    for name, bounds, said in (("learning_rate", ["log_float", float("nan"), 1e-3], "finite"),
                               ("learning_rate", ["float", 0.0, float("inf")], "finite"),
                               ("epochs", ["int", 1, float("inf")], "must be numbers"),
                               ("clip", ["categorical", [0.2, float("nan")]], "not NaN")):
        space = _write(tmp_path / "space.yaml", {name: bounds})
        err = _error(capsys, ["tune", "ppo", *TINY, "--trials", "1", "--space", str(space), *out])
        assert name in err and said in err, err
    space = _write(tmp_path / "space.yaml", {"max_grad_norm": ["categorical", [0.5, float("inf")]]})
    assert load_space("ppo", space)["max_grad_norm"] == ("categorical", [0.5, float("inf")])
    err = _error(capsys, ["tune", "mcts", *TINY, "--trials", "1", *out])
    assert "no search space for mcts" in err and "dqn, impala, ppo" in err and "--space" in err
    err = _error(capsys, ["tune", "ppo", *TINY, "--trials", "1", "--set", "bogus=1", *out])
    assert "--set bogus" in err
    err = _error(capsys, ["tune", "ppo", *TINY, "--trials", "1", "--set", "num_actors=4", *out])
    assert "the single runtime does not use: num_actors" in err  # before any worker starts
    err = _error(capsys, ["tune", "ppo", *TINY, "--trials", "1", "--storage", "nope://x", *out])
    assert "--storage nope://x: Optuna cannot open it" in err and "sqlite:///" in err
    err = _error(capsys, ["tune", "ppo", "--env", "CartPole-v1", "--total-steps", "-5",
                          "--trials", "1", *out])  # fmt: skip
    assert "--total-steps must be >= 1, got -5" in err
    for flag in ("--startup-trials", "--warmup-evals"):  # Optuna's pruner raised ValueError
        err = _error(capsys, ["tune", "ppo", *TINY, "--trials", "1", flag, "-2", *out])
        assert f"{flag} must be >= 0, got -2" == err.split("error: ")[-1].strip(), err
    err = _error(capsys, ["tune", "ppo", *TINY, "--trials", "0", "--jobs", "-1", *out])
    assert "--trials must be >= 1, got 0; --jobs must be >= 1, got -1" in err, err
    monkeypatch.setitem(sys.modules, "optuna", None)  # as if it were not installed
    err = _error(capsys, ["tune", "ppo", *TINY, "--trials", "1", *out])
    assert "pip install 'rlherd[tune]'" in err


def test_an_integer_range_with_fractional_bounds_is_refused(tmp_path, capsys):
    """``epochs: [int, 1.5, 3]`` searched 1 to 3: the bounds were cut to integers without a
    word, so the space searched was not the one written."""
    space = _write(tmp_path / "space.yaml", {"epochs": ["int", 1.5, 3]})
    err = _error(capsys, ["tune", "ppo", *TINY, "--trials", "1", "--space", str(space),
                          "--out", str(tmp_path / "study"), "--storage", "nope://x"])  # fmt: skip
    assert "epochs's bounds must be whole numbers for int, got [1.5, 3]" in err, err
    assert load_space("ppo", _write(space, {"epochs": ["int", 1.0, 3]}))["epochs"] == ("int", 1, 3)


def test_a_budget_of_zero_steps_is_refused_not_taken_for_the_presets(tmp_path, capsys):
    """``--total-steps 0`` ran trials of the preset's run length (100,000 steps for PPO on
    CartPole) where ``rlherd train --total-steps 0`` is refused. (The storage that cannot be
    opened comes after the budget's check: with the old behaviour it fails instead of training.)"""
    err = _error(capsys, ["tune", "ppo", "--env", "CartPole-v1", "--total-steps", "0",
                          "--trials", "1", "--storage", "nope://x", "--out",
                          str(tmp_path / "study")])  # fmt: skip
    assert "--total-steps must be >= 1, got 0" in err, err


def test_a_continued_study_must_be_the_same_study(tmp_path, capsys):
    """Trials of another budget would not compare with the study's: refused, naming what
    differs."""
    space = _write(tmp_path / "space.yaml", {name: None for name in SPACES["ppo"]})
    args = ["tune", "ppo", "--env", "CartPole-v1", "--eval-episodes", "1", "--trials", "1",
            "--space", str(space), "--out", str(tmp_path / "study")]  # fmt: skip
    assert main([*args, "--total-steps", "300", "--eval-every", "300"]) == 0
    capsys.readouterr()
    err = _error(capsys, [*args, "--total-steps", "400", "--eval-every", "400"])
    assert "was made with total_steps 300, eval_every 300" in err


def test_a_continued_study_with_another_kind_of_distribution_is_refused(tmp_path, capsys):
    """A study whose trials drew ``epochs`` from a categorical, continued with a space that draws
    it as an int: Optuna raised ValueError as the new trial drew it (a traceback, and a failed
    trial left in the study). Refused in one line before any trial starts."""
    only_epochs = {name: None for name in SPACES["ppo"]}
    args = ["tune", "ppo", "--env", "CartPole-v1", "--eval-episodes", "1", "--trials", "1",
            "--total-steps", "300", "--eval-every", "300", "--out", str(tmp_path / "study")]
    made = _write(tmp_path / "made.yaml", {**only_epochs, "epochs": ["categorical", [1, 2]]})
    assert main([*args, "--space", str(made)]) == 0
    capsys.readouterr()
    other = _write(tmp_path / "other.yaml", {**only_epochs, "epochs": ["int", 1, 2]})
    err = _error(capsys, [*args, "--space", str(other)])
    assert "drew epochs from CategoricalDistribution" in err and "IntDistribution" in err, err
    assert [row["state"] for row in _rows(tmp_path / "study")] == ["COMPLETE"]


@pytest.mark.parametrize("agent", sorted(SPACES))
def test_every_space_names_real_fields_with_values_the_agent_takes(agent):
    """Each field of a built-in space is one of the agent's config, and each end of its range
    (each choice) is a value the config accepts on its own."""
    space = load_space(agent)
    assert space == {k: tuple(v) if v[0] != "categorical" else ("categorical", list(v[1]))
                     for k, v in SPACES[agent].items()}  # fmt: skip
    builder = BUILDERS[agent]
    base = apply_overrides(builder.config_class(), builder.presets[builder.preset_for("x")])
    for name, (kind, *rest) in space.items():
        values = rest[0] if kind == "categorical" else rest
        if kind == "log_one_minus":
            values = [1 - v for v in values]
        if kind == "run_fraction":
            values = [max(1, round(v * 100_000)) for v in values]
        for value in values:
            apply_overrides(base, {name: value})


def test_ctrl_c_stops_every_worker_and_keeps_the_study(tmp_path):
    """Ctrl-C in a terminal reaches the command and its workers (one process group): the
    command exits 130 once every worker has ended, and writes the table of what it has."""
    script = "import sys; from rlherd.cli import main; sys.exit(main(sys.argv[1:]))"
    study = tmp_path / "study"
    space = _write(tmp_path / "space.yaml", {name: None for name in SPACES["ppo"]})
    proc = subprocess.Popen(
        [sys.executable, "-c", script, "tune", "ppo", "--env", "CartPole-v1", "--trials", "4",
         "--jobs", "2", "--total-steps", "1000000", "--eval-every", "1000", "--eval-episodes",
         "1", "--space", str(space), "--out", str(study)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True,
        stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(list(study.glob("trial-*/metrics/evaluator.csv"))) < 2:  # both training
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.5)
        children = _children(proc.pid)
        assert len(children) >= 2
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 130, proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # (multiprocessing's resource tracker, one of them, ends once it sees the command gone)
    deadline = time.monotonic() + 10
    while [pid for pid in children if Path(f"/proc/{pid}").exists()] and (
            time.monotonic() < deadline):  # fmt: skip
        time.sleep(0.2)
    assert not [pid for pid in children if Path(f"/proc/{pid}").exists()]
    rows = _rows(study)
    assert len(rows) == 2 and {(r["state"], r["note"]) for r in rows} == {("FAIL", "interrupted")}
    for row in rows:  # their runs stopped at a safe point, as on Ctrl-C
        summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
        assert summary["stopped_by"] in ("SIGINT", "SIGTERM")


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found
