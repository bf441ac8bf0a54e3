"""Configs, the run directory, checkpoints and the CLI's errors."""

import csv
import dataclasses
import json
import re
import typing

import gymnasium as gym
import numpy as np
import pytest

import rlherd
from rlherd.agents import BUILDERS
from rlherd.agents.impala import ImpalaConfig
from rlherd.cli import main
from rlherd.commands.train import resolve_config
from rlherd.config import apply_overrides, as_type, parse_set
from rlherd.errors import ConfigError
from rlherd.run.rundir import CSVLogger, RunDir


def test_parse_and_apply_overrides():
    over = parse_set(["batch_size=32", "use_lstm=true", "hidden_sizes=128,64", "reward_clip=none"])
    config = apply_overrides(ImpalaConfig(), over)
    assert config.batch_size == 32 and config.use_lstm is True
    assert config.hidden_sizes == (128, 64) and config.reward_clip is None
    assert apply_overrides(ImpalaConfig(), {"learning_rate": "1e-3"}).learning_rate == 1e-3


@pytest.mark.parametrize(
    "items,message",
    [
        (["batch_size"], "malformed --set 'batch_size'"),
        (["=3"], "malformed"),
    ],
)
def test_malformed_set(items, message):
    with pytest.raises(ConfigError, match=message):
        parse_set(items)


def test_bad_overrides_are_named():
    with pytest.raises(ConfigError, match="Did you mean: learning_rate"):
        apply_overrides(ImpalaConfig(), {"learning_rat": "1"})
    with pytest.raises(ConfigError, match="batch_size='many': expected int"):
        apply_overrides(ImpalaConfig(), {"batch_size": "many"})
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        apply_overrides(ImpalaConfig(), {"batch_size": "0"})
    with pytest.raises(ValueError, match="optimizer"):
        ImpalaConfig(optimizer="sgd")
    with pytest.raises(ConfigError, match="entropy_cost=nan: give ImpalaConfig.entropy_cost a"):
        apply_overrides(ImpalaConfig(), {"entropy_cost": "nan"})  # a field nothing else checks


@pytest.mark.parametrize("argv", [
    ["train", "ppo", "--env", "CartPole-v1", "--seed", "-1"],
    ["train", "ppo", "--env", "CartPole-v1", "--seed", str(2**32)],
    ["train", "ppo", "--env", "CartPole-v1", "--seeds", f"1-{2**32}"],
    ["tune", "ppo", "--env", "CartPole-v1", "--trials", "1", "--seed", "-1"],
    ["check-env", "CartPole-v1", "--seed", "-1"],
    ["bsuite", "dqn", "--ids", "catch/0", "--out", "sweep", "--seed", str(2**32 // 1000 + 1)],
])  # fmt: skip
def test_a_seed_numpy_cannot_take_is_one_line(argv, capsys, tmp_path, monkeypatch):
    """A run seeds numpy's legacy generator, which takes 0 to 2**32 - 1 (a bsuite id's seed is
    1000 * --seed + its number): outside that, one line before anything starts, not numpy's
    traceback from inside the run."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "from 0 to 2**32 - 1" in err, err
    assert not list(tmp_path.iterdir())  # nothing was made


def test_rlherd_train_takes_any_whole_seed_numpy_can(tmp_path):
    """A seed of numpy's integer types is a seed (drawn from a Generator, say); a fraction, a
    bool or one out of range is refused at once (a range test on a float walked the range)."""
    for bad in (-1, 2**32, np.int64(-1), 2.5, True):
        with pytest.raises(ConfigError, match="whole number from 0 to 2"):
            rlherd.train("ppo", "CartPole-v1", seed=bad, total_steps=10, run_dir=tmp_path / "run")
    run = rlherd.train("ppo", "CartPole-v1", seed=np.int64(7), total_steps=64, unroll_length=16,
                       run_dir=tmp_path / "run", progress=False)  # fmt: skip
    assert run.config.seed == 7 and type(run.config.seed) is int


RATES = ("learning_rate", "policy_learning_rate", "critic_learning_rate", "value_learning_rate",
         "adam_eps", "rmsprop_eps")  # fmt: skip


@pytest.mark.parametrize("agent", sorted(BUILDERS))
def test_every_agent_refuses_a_learning_rate_or_discount_it_cannot_learn_with(agent):
    """A negative or NaN rate (gradient ascent, or parameters gone NaN at the first step), or a
    discount outside [0, 1], is one line naming the field before the run starts."""
    fields = {f.name for f in dataclasses.fields(BUILDERS[agent].config_class)}
    bad = [(name, value) for name in RATES if name in fields for value in ("-1", "0", "nan")]
    bad += [("discount", value) for value in ("1.5", "-0.1", "nan") if "discount" in fields]
    assert bad
    for name, value in bad:
        with pytest.raises(ConfigError, match=name):
            resolve_config(agent, "CartPole-v1", None, {name: value})
    config_class = BUILDERS[agent].config_class
    for name, value in bad:  # built in Python, past --set's parsing: the config's own checks
        with pytest.raises(ValueError, match=name):
            config_class(**{name: float(value)})
    for name in RATES:  # None is a rate left out only where the field's type allows it
        optional = type(None) in typing.get_args(typing.get_type_hints(config_class).get(name))
        if name in fields and not optional:
            with pytest.raises(ValueError, match=name):
                config_class(**{name: None})


@pytest.mark.parametrize(("flags", "said"), [
    (["--eval-episodes", "0"], "eval_episodes must be >= 1"),
    (["--eval-every", "-5"], "eval_every must be >= 0"),
    (["--log-interval-s", "-1"], "log_interval_s must be >= 0"),
    (["--checkpoint-interval-s", "-0.5"], "checkpoint_interval_s must be >= 0"),
    (["--runtime", "poly", "--stall-timeout-s", "-1"], "stall_timeout_s must be >= 0"),
    (["--device", "tpu"], "device='tpu' is not a torch device"),
])  # fmt: skip
def test_settings_a_run_cannot_use_are_one_line(flags, said, capsys, tmp_path):
    """Evaluations of no episodes wrote NaN rows, a negative period silently meant none, a
    negative interval between logs or checkpoints meant 'every step', a negative stall timeout
    would stop a poly run at once, and a device torch does not know raised from inside it."""
    argv = ["train", "ppo", "--env", "CartPole-v1", "--total-steps", "100", "--no-progress"]
    assert main([*argv, "--run-dir", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and said in err, err
    assert not (tmp_path / "run").exists()


def test_keyword_values_of_another_type_are_one_line(tmp_path):
    """rlherd.train's keywords are typed as the config's fields: a value of another type is
    named before the run starts (a string among hidden sizes failed inside torch, a string
    budget in a comparison), while what a researcher writes for a number is taken (1e6 for
    an int, numpy's scalars and arrays, an int for a float, a list for a tuple)."""
    bad = [dict(hidden_sizes=[32, "x"]), dict(batch_size=4.5), dict(normalize_obs=1),
           dict(learning_rate=True), dict(total_steps="100")]  # fmt: skip
    for kwargs in bad:
        name = next(iter(kwargs))
        with pytest.raises(ConfigError, match=f"^{name}=.*: expected"):
            rlherd.train("ppo", "CartPole-v1", **{"total_steps": 64, **kwargs},
                         run_dir=tmp_path / "bad", progress=False)  # fmt: skip
    assert not (tmp_path / "bad").exists()
    run = rlherd.train("ppo", "CartPole-v1", total_steps=64.0, unroll_length=np.int64(16),
                       learning_rate=1, hidden_sizes=[8, 8], normalize_obs=np.bool_(False),
                       clip=np.float32(0.25), run_dir=tmp_path / "run",
                       progress=False)  # fmt: skip
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["total_steps"] == 64 and config["config"]["unroll_length"] == 16
    assert config["config"]["learning_rate"] == 1.0 and config["config"]["hidden_sizes"] == [8, 8]
    assert config["config"]["normalize_obs"] is False and config["config"]["clip"] == 0.25
    # The API's other arguments of another type: each was a TypeError or AttributeError deep
    # inside (env_kwargs unpacked with **, an id partitioned), or accepted (a negative seed).
    with pytest.raises(ConfigError, match=r"env_kwargs must be a dict .*got \[1\]"):
        rlherd.train("ppo", "CartPole-v1", total_steps=64, env_kwargs=[1],
                     run_dir=tmp_path / "bad", progress=False)  # fmt: skip
    with pytest.raises(ConfigError, match="make takes an environment id .*got 5"):
        rlherd.make(5)
    with pytest.raises(ConfigError, match="seed must be a whole number .*got -1"):
        rlherd.load_policy(tmp_path / "run", seed=-1)
    assert as_type("hidden_sizes", np.array([64, 64]), tuple[int, ...]) == (64, 64)
    with pytest.raises(ConfigError, match="expected int"):
        as_type("hidden_sizes", np.array([[64, 64]]), tuple[int, ...])
    assert run.summary["actor_steps"] >= 64


def test_csv_columns_grow(tmp_path):
    log = CSVLogger(tmp_path / "m.csv")
    log.write(dict(actor_steps=1, a=1))
    log.write(dict(actor_steps=2, a=2, b=3))
    log.close()
    rows = list(csv.DictReader(open(tmp_path / "m.csv")))
    assert rows == [
        {"actor_steps": "1", "a": "1", "b": ""},
        {"actor_steps": "2", "a": "2", "b": "3"},
    ]


def test_checkpoints_are_atomic_and_pruned(tmp_path):
    rundir = RunDir(tmp_path / "run", create=True)
    for step in range(4):
        rundir.save_checkpoint({"step": step}, step)
    assert rundir.load_checkpoint() == {"step": 3}
    files = sorted(p.name for p in rundir.checkpoint_dir.iterdir())
    assert files == ["ckpt-000000000002.pt", "ckpt-000000000003.pt", "latest"]
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        RunDir(tmp_path / "empty", create=True).load_checkpoint()
    with pytest.raises(FileNotFoundError, match="not an rlherd run directory"):
        RunDir(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()


def test_truncate_metrics(tmp_path):
    rundir = RunDir(tmp_path, create=True)
    for steps in (10, 20, 30):
        rundir.log("train", dict(actor_steps=steps, episode_return=1.0), step=steps)
    rundir.close()
    rundir.truncate_metrics(20)
    rows = list(csv.DictReader(open(tmp_path / "metrics" / "train.csv")))
    assert [r["actor_steps"] for r in rows] == ["10", "20"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "impala", "--env", "Cartpole-v1"], "Did you mean: CartPole-v1"),
        (["train", "impala", "--env", "CartPole-v1", "--set", "lr"], "malformed --set 'lr'"),
        (["train", "impala", "--env", "CartPole-v1", "--set", "lr=1"], "neither a field of"),
        (["eval", "/nonexistent/run"], "not an rlherd run directory"),
        (["train", "--resume", "/nonexistent/run"], "not an rlherd run directory"),
        (["train", "ppo", "--env", "CartPole-v1", "--set", "num_actors=2"], "use --num-actors 2"),
        (["train", "ppo", "--env", "CartPole-v1", "--num-actors", "2"],
         "the single runtime does not use: num_actors is a setting of the mono, poly"),
        (["train", "ppo", "--env", "CartPole-v1", "--runtime", "mono", "--num-actors", "two"],
         "num_actors='two': expected int"),
        (["serve-env", "tag-gridworld"], "environment servers serve single-agent"),
        (["serve-env", "CartPole-v1", "--envs-per-stream", "0"], "--envs-per-stream must be"),
    ],
)
def test_cli_errors_are_clear(argv, message, capsys, tmp_path):
    assert main([*argv, "--run-dir", str(tmp_path / "r")] if argv[0] == "train" else argv) == 2
    assert not (tmp_path / "r").exists() and not list(tmp_path.glob("nonexistent"))
    err = capsys.readouterr().err
    assert err.startswith("rlherd: error:") and message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", [["eval"], ["train", "--resume"], ["export"]])
def test_a_runs_config_file_given_for_the_run_names_its_folder(command, capsys, tmp_path):
    """``rlherd eval RUN/config.json`` said RUN/config.json had no config.json."""
    run = rlherd.train("dqn", "CartPole-v1", total_steps=50, run_dir=tmp_path / "run",
                       progress=False).path  # fmt: skip
    assert main([*command, str(run / "config.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"rlherd: error: {run / 'config.json'} is a file; give the run directory, "
                   f"the folder that holds it ({run})"), err


@pytest.mark.parametrize("argv", [
    ["train", "dqn", "--env", "CartPole-v1", "--run-dir", "FILE"],
    ["train", "dqn", "--env", "CartPole-v1", "--run-dir", "FILE/run"],
    ["train", "dqn", "--env", "CartPole-v1", "--seeds", "0-1", "--run-dir", "FILE/runs"],
    ["tune", "dqn", "--env", "CartPole-v1", "--trials", "1", "--total-steps", "9", "--out", "FILE"],
    ["bsuite", "dqn", "--ids", "catch/0", "--out", "FILE"],
    ["bsuite", "dqn", "--ids", "catch/0", "--out", "DIR/sweep", "--kept", "FILE/kept"],
    ["bsuite-report", "DIR", "-o", "FILE/report"],
])  # fmt: skip
def test_a_file_where_a_folder_goes_is_one_line_naming_it(argv, capsys, tmp_path):
    """A folder argument where a file already stands (a typo, a reused name) was a traceback
    from a ``mkdir`` deep inside the command."""
    file = tmp_path / "notes.txt"
    file.write_text("a file, not a folder")
    (tmp_path / "dir").mkdir()
    argv = [a.replace("FILE", str(file)).replace("DIR", str(tmp_path / "dir")) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlherd: error:") and f"{file} is a file; give a folder" in err, err
    assert "Traceback" not in err and file.read_text() == "a file, not a folder"


@pytest.mark.parametrize("argv", [
    ["train", "dqn", "--env", "CartPole-v1", "--total-steps", "9", "--run-dir", "LINK/run"],
    ["bsuite", "dqn", "--ids", "catch/0", "--out", "LINK"],
    ["bsuite", "dqn", "--ids", "catch/0", "--out", "/proc/rlherd-sweep"],
])  # fmt: skip
def test_a_folder_that_cannot_be_made_is_one_line_naming_its_flag(argv, capsys, tmp_path):
    """A folder mkdir cannot make (a dangling link in its way, /proc, a read-only disk) was the
    errno's line alone, which named neither the flag nor what to do."""
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    argv = [a.replace("LINK", str(tmp_path / "link")) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rlherd: error: {argv[-2]} {argv[-1]}: cannot make it ("), err
    assert err.rstrip().endswith("give a folder that can be written") and "\n" not in err.strip()


def test_a_sweep_refused_for_one_folder_makes_none_of_the_others(capsys, tmp_path):
    """A sweep checks --out and --kept before it makes either: refused for its --out, it leaves
    no empty --kept folder behind (nor, refused for its --kept, an --out)."""
    file = tmp_path / "notes.txt"
    file.write_text("a file, not a folder")
    kept, out = tmp_path / "kept", tmp_path / "sweep"
    assert main(["bsuite", "dqn", "--ids", "catch/0", "--out", str(file), "--kept", str(kept)]) == 2
    assert main(["bsuite", "dqn", "--ids", "catch/0", "--out", str(out), "--kept", str(file)]) == 2
    assert capsys.readouterr().err.count(f"{file} is a file; give a folder") == 2
    assert not kept.exists() and not out.exists()


@pytest.mark.parametrize("command", ["train", "eval", "plot", "check-env", "serve-env"])
def test_cli_help_renders(command, capsys):
    """``--help`` of every command prints its usage (a ``%`` in a help text once broke it)."""
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert "usage: " in capsys.readouterr().out


def test_cli_runtime_settings_are_flags(tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["train", "ppo", "--env", "rlherd/Bandit-v0", "--total-steps", "64", "--no-progress",
            "--num-envs", "2", "--native-vector-env", "false", "--run-dir", str(run_dir)]
    assert main(argv) == 0
    settings = json.loads((run_dir / "config.json").read_text())["settings"]
    assert settings["num_envs"] == 2 and settings["native_vector_env"] is False


def test_cli_train_writes_the_run_directory(tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["train", "impala", "--env", "rlherd/Bandit-v0", "--total-steps", "640"]
    assert main([*argv, "--run-dir", str(run_dir), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("agent", "env", "runtime", "actor_steps", "learner_steps", "episodes",
                "wall_time_s", "sps", "final_return_mean"):  # fmt: skip
        assert key in summary
    assert summary["actor_steps"] == 640 and summary["episodes"] > 0
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    config = json.loads((run_dir / "config.json").read_text())
    assert config["config"]["unroll_length"] == 8 and config["preset"] == "toy"
    assert config["settings"]["num_envs"] is None and "num_envs" not in config["config"]
    assert (run_dir / "metrics" / "train.csv").exists()
    assert (run_dir / "metrics" / "learner.csv").exists()
    assert list((run_dir / "tb").glob("events.*"))
    assert (run_dir / "checkpoints" / "latest").exists()


@pytest.mark.parametrize("runtime", ["single", "mono"])
def test_eval_episodes_alone_evaluates_once_at_the_end(runtime, tmp_path):
    """``--eval-episodes N`` without ``--eval-every`` asks for an evaluation: the run gives one,
    of N episodes, at its end (it once evaluated never, and said nothing), with actors in this
    process or in others; the device runtime, which cannot evaluate while it trains, says so
    naming the flag."""
    run_dir = tmp_path / "run"
    argv = ["train", "impala", "--env", "rlherd/Bandit-v0", "--total-steps", "640",
            "--eval-episodes", "7", "--runtime", runtime, "--run-dir", str(run_dir),
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_episodes"] == 7 and summary["eval_return_mean"] is not None
    rows = (run_dir / "metrics" / "evaluator.csv").read_text().strip().splitlines()
    assert len(rows) == 2 and int(rows[1].split(",")[0]) >= 640 and rows[1].endswith(",7"), rows
    with pytest.raises(ConfigError, match="--eval-episodes"):
        rlherd.train("ppo", "CartPole-v1", runtime="device", eval_episodes=3,
                     run_dir=tmp_path / "device", progress=False)  # fmt: skip


def test_a_runs_end_asks_for_one_evaluation_of_its_final_policy(monkeypatch):
    """Evaluator.due's schedule: every eval_every steps, and at the end (``end=True``) once,
    unless the latest evaluation already reached the budget (actors of other processes may
    carry the count past it). A run that ended below its budget (by its episodes) asked again
    after its final evaluation, and the distributed driver, which asks until none is due,
    evaluated it over and over."""
    from rlherd.run import evaluation

    monkeypatch.setattr(evaluation, "EvalEpisodes", lambda *args: None)

    class Recorder:
        counts, total_steps = "actor_steps", 25_000

        def __init__(self):
            self.counters = {"actor_steps": 0}

    def schedule(moves):
        recorder = Recorder()
        evaluator = evaluation.Evaluator(None, None, "", {}, recorder, 10_000, 1)
        asked = []
        for steps, end in moves:
            recorder.counters["actor_steps"] = steps
            asked.append(evaluator.due(end))
        return asked

    # The budget is no multiple of eval_every: the final policy gets one at the end.
    assert schedule([(10_000, False), (15_000, False), (25_000, True), (25_000, True)]) == [
        10_000, None, 25_000, None]  # fmt: skip
    # One due at the budget was run past it: none more at the end.
    assert schedule([(25_004, False), (25_010, True)]) == [25_004, None]
    # Ended by its episodes, below the budget: one at the end, and that is all.
    assert schedule([(10_000, False), (12_000, True), (12_000, True)]) == [10_000, 12_000, None]


def test_learner_rows_are_step_weighted_means_read_once_per_interval(tmp_path):
    """Learner metrics (tensors or numbers) are kept until the log interval's row: one row for
    many steps, each metric the mean over its steps, ints (counts) their latest value."""
    import torch

    from rlherd.run.recorder import Recorder, mean_metrics

    rows = [(1, dict(loss=torch.tensor(1.0), lag=3)), (3, dict(loss=torch.tensor(5.0), lag=4)),
            (1, dict(loss=2.0, other=7.0))]  # fmt: skip
    assert mean_metrics(rows) == dict(loss=(1 + 15 + 2) / 5, lag=4, other=7.0)

    recorder = Recorder(RunDir(tmp_path, create=True), dict(agent="a", env="e", runtime="r"),
                        100, progress=False, log_interval_s=1e9)  # fmt: skip
    for i in range(10):
        recorder.learner(dict(loss=torch.tensor(float(i))))
    assert not (tmp_path / "metrics" / "learner.csv").exists()  # nothing read or written yet
    recorder.write_learner_row()
    recorder.close()
    (row,) = list(csv.DictReader(open(tmp_path / "metrics" / "learner.csv")))
    assert int(row["learner_steps"]) == 10 and float(row["loss"]) == 4.5


def test_unread_learner_metrics_are_bounded_and_fold_into_the_same_mean(tmp_path, monkeypatch):
    import torch

    from rlherd.run import recorder as recorder_mod

    monkeypatch.setattr(recorder_mod, "MAX_UNREAD", 4)
    recorder = recorder_mod.Recorder(RunDir(tmp_path, create=True),
                                     dict(agent="a", env="e", runtime="r"), 100, progress=False,
                                     log_interval_s=1e9)  # fmt: skip
    for i in range(10):
        recorder.learner(dict(loss=torch.tensor(float(i))))
        assert len(recorder._learned) < 4
    recorder.write_learner_row()
    recorder.close()
    (row,) = list(csv.DictReader(open(tmp_path / "metrics" / "learner.csv")))
    assert int(row["learner_steps"]) == 10 and float(row["loss"]) == pytest.approx(4.5)


def test_a_non_finite_learner_row_stops_the_run_after_it_is_written(tmp_path):
    import torch

    from rlherd.errors import TrainingDiverged
    from rlherd.run.recorder import Recorder

    recorder = Recorder(RunDir(tmp_path, create=True), dict(agent="a", env="e", runtime="r"),
                        100, progress=False, log_interval_s=1e9)  # fmt: skip
    recorder.learner(dict(loss=torch.tensor(1.0)))
    recorder.learner(dict(loss=torch.tensor(float("nan"))))
    with pytest.raises(TrainingDiverged, match="learner steps 1-2: loss=nan"):
        recorder.write_learner_row()
    recorder.close()
    assert "nan" in (tmp_path / "metrics" / "learner.csv").read_text()


def flushes_subnormals() -> bool:
    """Whether this thread's float arithmetic flushes subnormals (below 1.2e-38) to zero."""
    import torch

    return (torch.tensor([1e-39]) * 1.0).item() == 0.0


def test_torch_threads_flushes_subnormals_here_and_in_threads_started_later():
    import threading

    import torch

    from rlherd.runtime import torch_threads

    torch.set_flush_denormal(False)
    assert not flushes_subnormals()
    torch_threads(1)
    seen: list[bool] = []
    thread = threading.Thread(target=lambda: seen.append(flushes_subnormals()))
    thread.start()
    thread.join()
    assert flushes_subnormals() and seen == [True]


@pytest.mark.parametrize("runtime", ["single", "mono"])
def test_learners_step_with_subnormals_flushed(runtime, tmp_path, monkeypatch):
    """Adam's moments of dead units decay through the subnormal range, x86's slow path (1.34x
    on RL Zoo's CartPole DQN): a run's learner steps with subnormals flushed to zero."""
    import torch

    import rlherd
    from rlherd.agents.dqn.learning import DQNLearner

    seen: list[bool] = []
    learn = DQNLearner.learn

    def spy(self, sample):
        seen.append(flushes_subnormals())
        return learn(self, sample)

    monkeypatch.setattr(DQNLearner, "learn", spy)
    torch.set_flush_denormal(False)
    rlherd.train("dqn", "CartPole-v1", runtime=runtime, total_steps=1_500, run_dir=tmp_path,
                 progress=False, **({"num_actors": 1} if runtime == "mono" else {}))  # fmt: skip
    assert seen and all(seen)


# ----------------------------------------------------------------------- dict observations
def test_eval_plays_dict_observation_runs_and_records_minigrid(tmp_path, capsys):
    """``rlherd eval`` of a replay agent trained on dict observations: Taxi's state and action
    mask, and MiniGrid's image and direction, whose first episode it records (``--video``) as
    a GIF and an MP4 of the rendered frames, one per step."""
    pytest.importorskip("minigrid")
    iio = pytest.importorskip("imageio.v3")
    import rlherd

    runs = {"Taxi-v3": tmp_path / "taxi", "minigrid:MiniGrid-Empty-5x5-v0": tmp_path / "grid"}
    for env_id, run_dir in runs.items():
        rlherd.train("dqn", env_id, total_steps=200, min_replay_size=100, run_dir=run_dir,
                     progress=False)  # fmt: skip
    assert main(["eval", str(tmp_path / "taxi"), "--episodes", "2"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["eval_episodes"] == 2
    for video in ("episode.gif", "episode.mp4"):
        assert main(["eval", str(tmp_path / "grid"), "--episodes", "1", "--video",
                     str(tmp_path / video)]) == 0  # fmt: skip
        length = json.loads(capsys.readouterr().out.splitlines()[-1])["eval_episode_length_mean"]
        frames = iio.imread(tmp_path / video)
        assert frames.shape[1:] == (320, 320, 3)  # 5 cells of 32 pixels, enlarged 2x to >= 256
        if video.endswith(".mp4"):  # a GIF merges repeated frames
            assert len(frames) == length


def test_a_run_records_what_it_ran_on(tmp_path):
    """config.json says where the run started and summary.json where its latest session ran:
    rlherd's version and commit, the CPU's model (not just its architecture), its cores and
    the run's torch threads, and the key packages' versions."""
    import json
    from pathlib import Path

    import rlherd

    run = rlherd.train("dqn", "rlherd/Corridor-v0", total_steps=50, run_dir=tmp_path / "run",
                       progress=False, torch_threads=1)  # fmt: skip
    started = json.loads((run.path / "config.json").read_text())["machine"]
    latest = json.loads((run.path / "summary.json").read_text())["machine"]
    for machine in (started, latest):
        assert machine["rlherd"] == rlherd.__version__ and machine["cores"] >= 1
        assert machine["packages"]["torch"] and machine["packages"]["gymnasium"]
        assert machine["torch_threads"] == 1
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                  if line.startswith("model name")]  # fmt: skip
        assert not models or started["cpu"] == models[0]
    if (Path(rlherd.__file__).parents[1] / ".git").exists():
        assert started["commit"] and len(started["commit"].removesuffix("-dirty")) == 40


def test_load_policy_acts_as_the_runs_evaluation_does(tmp_path):
    """A run's policy from Python acts for one observation or a batch, as ``rlherd eval``'s
    actor does; runs it cannot stand for are one line."""
    import numpy as np

    import rlherd
    from rlherd.commands.evaluate import evaluate
    from rlherd.errors import ConfigError

    run = rlherd.train("ppo", "CartPole-v1", total_steps=3_000, seed=0,
                       run_dir=tmp_path / "run", progress=False)  # fmt: skip
    policy = rlherd.load_policy(run.path)
    env = rlherd.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    ret, done = 0.0, False
    while not done:
        action = policy(obs)
        assert np.ndim(action) == 0 and env.action_space.contains(int(action))
        obs, reward, terminated, truncated, _ = env.step(int(action))
        ret, done = ret + reward, terminated or truncated
    # rlherd eval plays the same greedy policy: the same return on the same seed.
    assert evaluate(run.path, episodes=1, seed=0)["eval_return_mean"] == ret
    batch = np.stack([env.observation_space.sample() for _ in range(5)])
    assert policy(batch).shape == (5,)
    # act() gives what the policy computed: the greedy action is the logits' argmax, and the
    # critic's value (baseline) is there, for one observation or a batch.
    actions, outputs = policy.act(batch)
    assert outputs["policy_params"].shape == (5, 2) and outputs["baseline"].shape == (5,)
    np.testing.assert_array_equal(actions, outputs["policy_params"].argmax(-1))
    action, one = policy.act(batch[0])
    assert action == actions[0]
    # The same up to float32 rounding: a batch of one and of five may take different kernels.
    assert one["baseline"] == pytest.approx(outputs["baseline"][0], rel=1e-5)
    dqn = rlherd.train("dqn", "CartPole-v1", total_steps=600, run_dir=tmp_path / "dqn",
                       progress=False)  # fmt: skip
    actions, outputs = rlherd.load_policy(dqn.path).act(batch)
    np.testing.assert_array_equal(actions, outputs["q_values"].argmax(-1))
    # An observation of another shape is one line naming the one the policy reads (it was
    # torch's IndexError or RuntimeError, or a TypeError for None).
    for wrong, got in ((np.zeros(7), "(7,)"), (np.zeros((2, 5)), "(2, 5)"), (None, "()")):
        with pytest.raises(ConfigError, match=re.escape(
                f"reads observations as rlherd.make('CartPole-v1') gives them: one of shape "
                f"(4,), or a batch of them (a leading dimension); got shape {got}")):  # fmt: skip
            policy(wrong)
    # A non-finite observation is refused, in one observation or a batch: the network's NaN
    # outputs were read as action 0.
    for bad in (np.array([0.0, np.nan, 0.0, 0.0]), np.where(np.eye(5, 4) > 0, np.inf, batch)):
        with pytest.raises(ConfigError, match="holds NaN or inf values"):
            policy(bad)
    device = rlherd.train("ppo", "CartPole-v1", runtime="device", total_steps=512,
                          run_dir=tmp_path / "device", progress=False)  # fmt: skip
    with pytest.raises(ConfigError, match="play it with rlherd eval"):
        rlherd.load_policy(device.path)


class Switches(gym.Env):
    """Five switches, observed as Gymnasium's MultiBinary (rlherd.make names it 'observation');
    ``tupled``: with a Discrete counter beside them, a Tuple (keys '0' and '1')."""

    def __init__(self, tupled: bool = False):
        self.tupled = tupled
        switches = gym.spaces.MultiBinary(5)
        self.observation_space = (gym.spaces.Tuple((switches, gym.spaces.Discrete(3))) if tupled
                                  else switches)  # fmt: skip
        self.action_space = gym.spaces.Discrete(5)

    def _obs(self):
        switches = np.zeros(5, np.int8)
        return (switches, 0) if self.tupled else switches

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        return self._obs(), 0.0, False, True, {}


@pytest.mark.parametrize("tupled, got", [(False, "got a ndarray object of shape (5,)"),
                                         (True, "got a tuple object")])  # fmt: skip
def test_load_policy_given_the_raw_observation_says_it_reads_rlherd_makes(tupled, got, tmp_path):
    """An environment's own observation of a MultiBinary or Tuple space, where the policy reads
    rlherd.make's dict of arrays: one line saying so, where it named the same shape twice
    (MultiBinary) or was numpy's "inhomogeneous shape" ValueError (Tuple)."""
    env = f"{__name__}:Switches"
    run = rlherd.train("dqn", env, env_kwargs=dict(tupled=tupled), total_steps=50,
                       run_dir=tmp_path / "run", progress=False)  # fmt: skip
    policy = rlherd.load_policy(run.path)
    raw, _ = Switches(tupled).reset(seed=0)
    with pytest.raises(ConfigError, match=re.escape(
            f"reads observations as rlherd.make('{env}') gives them: one of shapes ") +
            r"\{.*\} \(a dict of arrays\), or a batch of them \(a leading dimension\); " +
            re.escape(got) + "$"):  # fmt: skip
        policy(raw)
    made, _ = rlherd.make(env, tupled=tupled).reset(seed=0)
    assert policy(made) in range(5)


def test_the_evaluator_and_rlherd_eval_play_the_same_episodes(tmp_path):
    """One evaluation protocol: the evaluator's last evaluation of a run and ``rlherd eval`` of
    its final checkpoint play the same seeds with the same greedy policy, whatever the run's
    own seed, so they score the same, and each says over how many episodes."""
    import csv

    import rlherd
    from rlherd.commands.evaluate import evaluate

    for seed in (0, 7):
        run = rlherd.train("ppo", "CartPole-v1", total_steps=2_048, seed=seed, eval_every=2_048,
                           eval_episodes=3, run_dir=tmp_path / f"run{seed}", progress=False)
        with open(run.path / "metrics" / "evaluator.csv", newline="") as f:
            last = list(csv.DictReader(f))[-1]
        assert int(last["eval_episodes"]) == 3 and run.summary["eval_episodes"] == 3
        again = evaluate(run.path, episodes=3)
        assert float(last["eval_return_mean"]) == again["eval_return_mean"]
        assert again["eval_episodes"] == 3
