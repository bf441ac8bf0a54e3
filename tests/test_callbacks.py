"""Callbacks and experiment tracking: hooks fire in order on every runtime, "stop" ends a run
cleanly (a final checkpoint, nothing left running, ``--resume`` goes on), the ready-made
callbacks do what they say, and W&B (offline) and MLflow receive the run, read back here."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import rlherd
from rlherd.cli import main
from rlherd.envs.vector import alive
from rlherd.errors import ConfigError
from rlherd.run.callbacks import Callback, SaveBest, StopAtReturn, StopWithoutImprovement
from rlherd.run.rundir import RunDir

CORRIDOR = "rlherd/Corridor-v0"


class Record(Callback):
    """Writes down every hook it hears, and says "stop" at the first evaluation if asked."""

    def __init__(self, stop_at_eval: bool = False):
        self.events: list[str] = []
        self.stop_at_eval = stop_at_eval
        self.logged: list[dict] = []

    def on_start(self, run):
        assert (run.path / "config.json").exists()
        self.events.append("start")

    def on_log(self, metrics):
        self.logged.append(metrics)
        self.events.append("log")

    def on_eval(self, results):
        assert math.isfinite(results["eval_return_mean"])
        self.events.append("eval")
        if self.stop_at_eval:
            self.reason = "told to"
            return "stop"
        return None

    def on_checkpoint(self, path: Path):
        assert path.exists()
        self.events.append("checkpoint")

    def on_end(self, summary):
        self.events.append("end")


def _in_order(events: list[str]) -> None:
    assert events[0] == "start" and events[-1] == "end", events
    assert events.count("start") == events.count("end") == 1, events
    assert {"log", "eval", "checkpoint"} <= set(events), events
    assert events[-3:] == ["checkpoint", "log", "end"], "the final checkpoint, then the last log"


@pytest.mark.parametrize("runtime", ["single", "mono", pytest.param("distributed",
                                                                    marks=pytest.mark.ray)])
def test_callbacks_fire_in_order_and_stop_every_runtime_cleanly(tmp_path, runtime):
    run_dir = tmp_path / "run"
    record = Record(stop_at_eval=True)
    run = rlherd.train("dqn", CORRIDOR, runtime=runtime, total_steps=10**7, seed=0,
                       run_dir=run_dir, eval_every=600, eval_episodes=2, progress=False,
                       log_interval_s=0.2, callbacks=[record])  # fmt: skip
    _in_order(record.events)
    assert run.summary["stopped_by"] == "Record: told to"
    assert not run.stopped  # finished, not interrupted
    assert run.summary["actor_steps"] < 10**6
    checkpoint = RunDir(run_dir).load_checkpoint()
    assert checkpoint["recorder"]["counters"]["learner_steps"] == run.summary["learner_steps"]
    if runtime == "distributed":
        nodes = json.loads((run_dir / "nodes.json").read_text())
        assert not [n for n, w in nodes.items() if alive(w["pid"])], "nodes left running"
    # A run stopped by a callback has finished its session: it goes on when resumed.
    steps = run.summary["actor_steps"]
    again = rlherd.train(resume=run_dir, total_steps=steps + 300, eval_every=10**6,
                         progress=False)  # fmt: skip
    assert again.summary["actor_steps"] >= steps + 300
    assert "stopped_by" not in again.summary
    # Its budget is no multiple of eval_every: the final policy is evaluated all the same (its
    # summary once gave an earlier policy's evaluation as the run's).
    last = (run_dir / "metrics" / "evaluator.csv").read_text().splitlines()[-1]
    assert int(last.split(",")[0]) >= steps + 300, last


def test_a_callback_may_stop_from_its_log_hook(tmp_path):
    stop = StopAtReturn(-1e9, metric="final_return_mean")  # any 20 finished episodes will do
    run = rlherd.train("ppo", CORRIDOR, total_steps=10**7, run_dir=tmp_path / "run",
                       progress=False, log_interval_s=0.1, callbacks=[stop])  # fmt: skip
    assert run.summary["stopped_by"].startswith("StopAtReturn: final_return_mean")
    assert run.summary["actor_steps"] < 10**6
    assert run.summary["final_return_window"] == 20  # not before its window was full


def test_a_training_return_stops_a_run_only_once_its_window_is_full():
    """The mean of the first few episodes is no mean of 20: one lucky episode of a random
    policy must not stop a run as if it had learned."""
    stop = StopAtReturn(0.9, metric="final_return_mean")
    lucky = [stop.on_log({"final_return_mean": 1.0, "final_return_window": n, "episodes": 99})
             for n in (1, 5, 19)]  # fmt: skip
    assert lucky == [None, None, None]
    assert stop.on_log({"final_return_mean": 0.8, "final_return_window": 20}) is None
    assert stop.on_log({"final_return_mean": 0.9, "final_return_window": 20}) == "stop"
    assert stop.reason == "final_return_mean 0.9 >= 0.9"
    # A game's policy has a window of its own: 20 episodes of taggers are 5 of the runner's.
    runner = StopAtReturn(0.9, metric="final_return_mean_runner")
    game = {"final_return_mean_runner": 1.0, "final_return_window_runner": 5,
            "final_return_window_tagger": 15, "final_return_window": 0, "episodes": 20}
    assert runner.on_log(game) is None
    assert runner.on_log({**game, "final_return_window_runner": 20}) == "stop"
    # A policy none of whose episodes has ended yet, while others' windows are full, is waited
    # for; a name with no window at all is none of the game's.
    knight = StopAtReturn(0.9, metric="final_return_mean_knight")
    castle = {"final_return_mean_archer": 1.0, "final_return_window_archer": 20,
              "final_return_mean_knight": None, "final_return_window_knight": 0,
              "final_return_window": 0, "episodes": 40}
    assert knight.on_log(castle) is None
    with pytest.raises(ConfigError, match="watches 'final_return_mean_knigt'"):
        StopAtReturn(0.9, metric="final_return_mean_knigt").on_log(castle)
    # Nor has a game of several policies one return of them all.
    with pytest.raises(ConfigError, match="final_return_mean_archer or final_return_mean_knight"):
        StopAtReturn(0.9, metric="final_return_mean").on_log(castle)


def test_stop_without_improvement_counts_evaluations_since_the_best():
    stop = StopWithoutImprovement(patience=2, min_delta=0.5)
    answers = [stop.on_eval({"eval_return_mean": r}) for r in (1.0, 2.0, 2.4, 1.0, 3.0, 3.0)]
    assert answers == [None, None, None, "stop", None, None]
    assert "2.0" in stop.reason
    minimise = StopWithoutImprovement(patience=1, metric="loss", mode="min")
    assert [minimise.on_eval({"loss": v}) for v in (3.0, 2.0, 2.5)] == [None, None, "stop"]


def test_a_watched_metric_the_run_does_not_report_is_one_line():
    with pytest.raises(ConfigError, match="watches 'eval_return_mean'.*final_return_mean"):
        StopAtReturn(1.0).on_eval({"final_return_mean": 1.0})


def test_watching_evaluations_a_run_never_makes_is_refused_before_it_starts(tmp_path):
    """A return no evaluation reaches (NaN), and evaluations first due past the run's end: both
    were accepted, and the run ended without stopping or keeping a best policy."""
    with pytest.raises(ConfigError, match="threshold must be a finite return, got nan"):
        StopAtReturn(float("nan"))
    with pytest.raises(ConfigError, match=r"this run of 300 steps has none \(--eval-every 1000"):
        rlherd.train("dqn", CORRIDOR, total_steps=300, run_dir=tmp_path / "run",
                     eval_every=1_000, progress=False, callbacks=[SaveBest()])  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_save_best_keeps_the_best_evaluations_policy(tmp_path):
    class Rigged(Callback):
        """Makes the second evaluation the best, whatever the returns, and keeps what the
        evaluations played with, to compare."""

        def __init__(self):
            self.played = []

        def on_start(self, run):
            self.run = run

        def on_eval(self, results):
            self.played.append({k: v.clone() for k, v in self.run.evaluated_policy().items()})
            results["eval_return_mean"] = 10.0 if len(self.played) == 2 else 0.0

    rigged, run_dir = Rigged(), tmp_path / "run"
    rlherd.train("dqn", CORRIDOR, total_steps=1_500, run_dir=run_dir, eval_every=500,
                 eval_episodes=1, progress=False, callbacks=[rigged, SaveBest()])  # fmt: skip
    assert len(rigged.played) == 3
    best = RunDir(run_dir).load_best()
    for name, value in rigged.played[1].items():
        assert torch.equal(best[name], value), name
    assert not all(torch.equal(best[k], v) for k, v in rigged.played[2].items())
    saved = json.loads((run_dir / "best" / "evaluation.json").read_text())
    assert saved["eval_return_mean"] == 10.0 and saved["actor_steps"] == 1_000
    # rlherd eval --best and load_policy(best=True) act with it.
    assert main(["eval", str(run_dir), "--best", "--episodes", "1"]) == 0
    assert "best_eval_return_mean" in RunDir(run_dir).read_summary()
    obs = np.zeros(rlherd.make(CORRIDOR).observation_space.shape, np.float32)
    assert rlherd.load_policy(run_dir, best=True)(obs) in (0, 1)


def test_the_cli_stops_at_a_return_and_exits_zero(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["train", "dqn", "--env", CORRIDOR, "--total-steps", "1000000", "--run-dir",
                 str(run_dir), "--eval-every", "500", "--eval-episodes", "1",
                 "--stop-at-return", "-100", "--save-best", "--no-progress"])  # fmt: skip
    assert code == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"].startswith("StopAtReturn: eval_return_mean")
    assert "stopped by StopAtReturn" in capsys.readouterr().err
    assert (run_dir / "best" / "policy.pt").exists()
    code = main(["train", "dqn", "--env", CORRIDOR, "--run-dir", str(tmp_path / "other"),
                 "--patience", "3"])  # fmt: skip
    assert code == 2 and "StopWithoutImprovement watches evaluations, and this run has none" in (
        capsys.readouterr().err)  # fmt: skip


@pytest.mark.parametrize(("flags", "says"), [
    (["--track-project", "mine"], "no tracker is named: add --track"),
    (["--track-uri", "sqlite:///x.db"], "no tracker is named: add --track"),
    (["--track", "wandb", "--track-uri", "sqlite:///x.db"], "--track names no mlflow"),
])  # fmt: skip
def test_where_to_track_without_a_tracker_to_take_it_is_refused(flags, says, tmp_path, capsys):
    """--track-project and --track-uri without --track (or the URI without mlflow) were ignored
    without a word: the run was logged nowhere the user looked."""
    code = main(["train", "dqn", "--env", CORRIDOR, "--run-dir", str(tmp_path / "run"),
                 "--total-steps", "100", "--no-progress", *flags])  # fmt: skip
    assert code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_callback_that_raises_stops_the_run_with_its_traceback(tmp_path):
    class Broken(Callback):
        def on_log(self, metrics):
            raise ValueError("a bug in the callback")

    heard = Record()
    with pytest.raises(ValueError, match="a bug in the callback"):
        rlherd.train("dqn", CORRIDOR, total_steps=10**7, run_dir=tmp_path / "run",
                     progress=False, log_interval_s=0.1, callbacks=[heard, Broken()])  # fmt: skip
    assert heard.events[-1] == "end", "every started callback hears the end"
    summary = RunDir(tmp_path / "run").read_summary()
    assert summary["error"] == "ValueError: a bug in the callback"


def test_a_tracker_whose_library_is_missing_is_one_line(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    missing = r"--track wandb needs wandb: pip install 'rlherd\[track\]'"
    with pytest.raises(ConfigError, match=missing):
        rlherd.train("dqn", CORRIDOR, total_steps=100, run_dir=tmp_path / "run", track="wandb")
    assert not (tmp_path / "run").exists(), "refused before a run directory was made"
    with pytest.raises(ConfigError, match="unknown tracker 'tensorboard'; --track takes"):
        rlherd.train("dqn", CORRIDOR, total_steps=100, track="tensorboard")


# ------------------------------------------------------------------------------- trackers
def wandb_records(path: Path):
    """The records of an offline W&B run's ``.wandb`` file: a LevelDB-style log (a 7-byte
    header; 32 KiB blocks of chunks, each a 4-byte checksum, a 2-byte length and a type: full,
    first, middle or last) of ``wandb_internal_pb2.Record`` messages. W&B's API reads runs from
    its server only, and its SDK no longer ships a reader of these files."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw, pos, whole = path.read_bytes(), 7, b""
    while pos + 7 <= len(raw):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(raw[pos + 4:pos + 6], "little"), raw[pos + 6]
        chunk, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        whole = chunk if kind in (1, 2) else whole + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(whole)
            yield record


def _items(items) -> dict:
    """A W&B record's items (a key, or a nested key of one part, and a JSON value) as a dict."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def _tracked_run(tmp_path: Path, track: str, **kw):
    return rlherd.train("dqn", CORRIDOR, total_steps=1_000, seed=3, run_dir=tmp_path / "run",
                        eval_every=500, eval_episodes=1, progress=False, log_interval_s=0.1,
                        track=track, **kw)  # fmt: skip


def test_wandb_offline_receives_the_config_metrics_evaluations_and_summary(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = _tracked_run(tmp_path, "wandb", track_project="tests")
    import wandb

    wandb.teardown()  # W&B's service process writes the file: wait until it has finished
    (log,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    records = list(wandb_records(log))
    (started,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = _items(started.config.update)
    assert config["agent"] == "dqn" and config["seed"] == 3
    assert config["config"]["learning_rate"] == run.config.config["learning_rate"]
    assert started.project == "tests"
    history = [_items(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]
    assert any("loss" in row for row in history)
    evals = [row for row in history if "eval_return_mean" in row]
    assert [row["actor_steps"] for row in evals] == [500, 1_000]
    summaries = [_items(r.summary.update) for r in records
                 if r.WhichOneof("record_type") == "summary"]  # fmt: skip
    assert any(s.get("final_return_mean") == run.summary["final_return_mean"]
               for s in summaries)  # fmt: skip
    artifacts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    assert [m.path for m in artifacts[0].manifest.contents] == [
        RunDir(tmp_path / "run").latest_checkpoint().name]


def test_mlflow_receives_the_run_and_a_resumed_run_continues_it(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)  # MLflow keeps artifacts in ./mlruns of a local store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = _tracked_run(tmp_path, "mlflow", track_uri=uri, track_project="tests")
    client = MlflowClient(tracking_uri=uri)
    (tracked,) = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert tracked.info.status == "FINISHED"
    assert tracked.data.params["agent"] == "dqn"
    assert tracked.data.params["config.learning_rate"] == str(run.config.config["learning_rate"])
    evals = client.get_metric_history(tracked.info.run_id, "eval_return_mean")
    assert [m.step for m in evals] == [500, 1_000]
    assert client.get_metric_history(tracked.info.run_id, "loss")
    names = {a.path for a in client.list_artifacts(tracked.info.run_id)}
    assert {"config.json", "summary.json"} <= names
    assert RunDir(tmp_path / "run").latest_checkpoint().name in names
    rlherd.train(resume=tmp_path / "run", total_steps=1_500, progress=False, track="mlflow",
                 track_uri=uri, track_project="tests")  # fmt: skip
    (same,) = client.search_runs([tracked.info.experiment_id])
    assert same.info.run_id == tracked.info.run_id
    steps = [m.step for m in client.get_metric_history(same.info.run_id, "eval_return_mean")]
    assert steps == [500, 1_000, 1_500]


# ------------------------------------------------------------------------- --config FILE
def test_a_config_file_sets_what_flags_would_and_flags_win(tmp_path):
    file = tmp_path / "ppo.yaml"
    file.write_text("agent: ppo\nenv: rlherd/Corridor-v0\ntotal_steps: 300\nseed: 4\n"
                    "config: {learning_rate: 0.001, epochs: 2}\n"
                    "settings: {num_envs: 2}\n")  # fmt: skip
    run_dir = tmp_path / "run"
    assert main(["train", "--config", str(file), "--set", "epochs=3", "--run-dir",
                 str(run_dir), "--no-progress"]) == 0  # fmt: skip
    record = RunDir(run_dir).read_config()
    assert (record.agent, record.env, record.seed, record.total_steps) == (
        "ppo", "rlherd/Corridor-v0", 4, 300)
    assert record.config["learning_rate"] == 0.001 and record.config["epochs"] == 3
    assert record.settings["num_envs"] == 2
    # A run's own config.json is a config file: it trains the same run again.
    again = tmp_path / "again"
    assert main(["train", "--config", str(run_dir / "config.json"), "--run-dir", str(again),
                 "--no-progress"]) == 0  # fmt: skip
    copy = RunDir(again).read_config()
    assert (copy.config, copy.settings, copy.seed) == (record.config, record.settings, 4)


@pytest.mark.parametrize("text, says", [
    ("agent: ppo\nenvv: CartPole-v1\n", "unknown key 'envv' (did you mean env?)"),
    ("- ppo\n", "must hold a mapping"),
    ("agent: !!python/object/apply:os.system ['echo hacked']\n", "--config"),
    ("config: 3\n", "config must be a mapping"),
    ("agent: ppo\nenv: CartPole-v1\ntotal_steps: 1e5\n", "total_steps must be a whole number, "
     "got '1e5' (YAML reads 1e5 as text: write 100000)"),
    ("agent: ppo\nenv: CartPole-v1\nseed: '3'\n", "seed must be a whole number"),
])  # fmt: skip
def test_a_bad_config_file_is_one_line(tmp_path, capsys, text, says):
    file = tmp_path / "bad.yaml"
    file.write_text(text)
    assert main(["train", "--config", str(file), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_the_guides_callback_example_runs(tmp_path, monkeypatch):
    """The Python example of docs/guides/callbacks-and-tracking.md, with a tiny budget; the
    metrics its callback reads are ones its run logs (it read ``total_loss``, which PPO does
    not log, so it could never stop the run)."""
    from test_docs import ROOT, blocks

    (example,) = blocks(ROOT / "docs" / "guides" / "callbacks-and-tracking.md", "python")
    tiny = "eval_every=500, total_steps=1_000, progress=False,"
    assert "eval_every=10_000," in example.text
    monkeypatch.chdir(tmp_path)
    record, train = Record(), rlherd.train
    monkeypatch.setattr(rlherd, "train", lambda *args, callbacks=(), **kwargs: train(
        *args, callbacks=[*callbacks, record], **kwargs))  # fmt: skip
    exec(compile(example.text.replace("eval_every=10_000,", tiny), "guide", "exec"), {})
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (run_dir / "best" / "policy.pt").exists()
    read = set(re.findall(r"metrics(?:\.get\(|\[)[\"'](\w+)[\"']", example.text))
    assert read and read <= set().union(*record.logged), (read, record.logged[-1])


def test_package_and_export_take_the_best_policy(tmp_path):
    """``--best`` reaches every reader of a run: a package of the best policy acts as
    ``load_policy(best=True)`` does, and so does its ONNX export."""
    pytest.importorskip("onnxruntime")
    import onnxruntime

    from rlherd.commands.export import export
    from rlherd.commands.package import package

    run_dir = tmp_path / "run"
    rlherd.train("dqn", "CartPole-v1", total_steps=1_500, run_dir=run_dir, eval_every=500,
                 eval_episodes=1, progress=False, callbacks=[SaveBest()])  # fmt: skip
    best, latest = (rlherd.load_policy(run_dir, best=b) for b in (True, False))
    obs = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    assert (best(obs) != latest(obs)).any(), "the best policy is not the latest here"
    result = package(run_dir, tmp_path / "pkg", episodes=1, video=False, best=True)
    assert any("best evaluation" in note for note in result["notes"])
    np.testing.assert_array_equal(rlherd.load_policy(tmp_path / "pkg")(obs), best(obs))
    session = onnxruntime.InferenceSession(str(export(run_dir, best=True)))
    (action,) = [o.name for o in session.get_outputs() if o.name == "action"]
    np.testing.assert_array_equal(session.run([action], {"obs": obs})[0], best(obs))


def test_a_trackers_outage_is_a_warning_not_the_end_of_the_run(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)

    def down(*args, **kwargs):
        raise ConnectionError("the tracking server went away")

    monkeypatch.setattr(MlflowClient, "log_batch", down)
    with pytest.warns(UserWarning, match="MlflowTracker could not log.*went away") as caught:
        run = _tracked_run(tmp_path, "mlflow", track_uri=f"sqlite:///{tmp_path / 'm.db'}")
    assert run.summary["actor_steps"] >= 1_000 and "error" not in run.summary
    assert sum("could not log" in str(w.message) for w in caught) == 1, "said once"


def test_a_shared_runs_config_names_no_code_of_its_own_and_not_its_machine(tmp_path, capsys,
                                                                            monkeypatch):
    """A run's config.json from elsewhere trains here without importing a module that sits in
    its folder (found first on the import path when `python -m rlherd.cli` runs there), and
    without the settings that named its machine (device, servers, cluster)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.chdir(shared)
    monkeypatch.syspath_prepend(str(shared))
    (shared / "evil.py").write_text("import os\nos.environ['RLHERD_PWNED'] = '1'\n")
    (shared / "summary.json").write_text("{}")
    (shared / "config.json").write_text(json.dumps({
        "agent": "ppo", "env": "evil:Env-v0", "total_steps": 100}))  # fmt: skip
    code = main(["train", "--config", str(shared / "config.json"), "--run-dir",
                 str(tmp_path / "run")])  # fmt: skip
    assert code == 2 and "would import 'evil' from inside the run directory" in (
        capsys.readouterr().err)
    assert "RLHERD_PWNED" not in __import__("os").environ
    (shared / "config.json").write_text(json.dumps({
        "agent": "ppo", "env": "rlherd/Corridor-v0", "total_steps": 200, "runtime": "single",
        "settings": {"device": "cuda:3", "num_envs": 2}}))  # fmt: skip
    assert main(["train", "--config", str(shared / "config.json"), "--run-dir",
                 str(tmp_path / "run"), "--no-progress"]) == 0  # fmt: skip
    settings = RunDir(tmp_path / "run").read_config().settings
    assert settings["device"] == "cpu" and settings["num_envs"] == 2
