"""Experiment tracking: a run's config, metrics, evaluations and summary sent to Weights & Biases
or MLflow, as callbacks (:mod:`rlherd.run.callbacks`), so they work on every runtime and cost
nothing per step.

``rlherd train ... --track wandb`` (or ``mlflow``, or ``wandb,mlflow``); in Python,
``rlherd.train(..., track="wandb")`` or ``callbacks=[WandbTracker(project="mine")]``.

- **W&B** follows its own settings: ``wandb login`` for the hosted service, ``WANDB_MODE=offline``
  to write the run under the run directory only (``wandb sync`` uploads it later). The run's
  files go to ``RUN/wandb/``.
- **MLflow** logs to ``--track-uri`` (a server ``http://...``, or a local store such as
  ``sqlite:///mlflow.db``), else to where ``MLFLOW_TRACKING_URI`` or MLflow's default points.

A resumed run continues the same tracked run: its id is kept in ``RUN/tracking.json``. Metrics
are logged against the run's step count (``actor_steps``; offline runs ``learner_steps``), so
curves of runtimes with different learner paces line up. At the end, the summary is logged,
and the latest checkpoint and any videos in the run directory are stored as artifacts.
"""

from __future__ import annotations

import numbers
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlherd.errors import ConfigError, Notice
from rlherd.run.callbacks import Callback, RunInfo
from rlherd.run.rundir import atomic_write_json, read_json

TRACKERS = ("wandb", "mlflow")


def numbers_of(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of ``metrics`` (trackers take numbers; the summary also holds the
    agent's name, the machine and ``None`` for what is not known yet)."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, numbers.Real) and not isinstance(v, bool)}  # fmt: skip


def logged(metrics: dict[str, Any]) -> dict[str, float]:
    """What a tracker logs of an ``on_log``: its numbers, less the latest evaluation's (the
    summary repeats them; they are logged once, at the step they were measured, by
    ``on_eval``)."""
    return {k: v for k, v in numbers_of(metrics).items() if not k.startswith("eval_")}


class _Ids:
    """The tracked run's id of each tracker, kept in ``RUN/tracking.json`` so that ``--resume``
    continues it."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "tracking.json"

    def get(self, tracker: str) -> str | None:
        if not self.path.exists():
            return None
        value = read_json(self.path).get(tracker)
        return value if isinstance(value, str) else None

    def set(self, tracker: str, run_id: str) -> None:
        ids = read_json(self.path) if self.path.exists() else {}
        atomic_write_json(self.path, {**ids, tracker: run_id})


class _Tracker(Callback):
    """What both trackers share: they keep the latest checkpoint's path for the end, and a
    tracker's outage (a server gone, a full quota) is a warning, never the end of a run of
    hours; their own bugs included, since the run's files hold everything they would log."""

    def __init__(self) -> None:
        self.info: RunInfo | None = None
        self.checkpoint: Path | None = None
        self.failed = False

    def on_checkpoint(self, path: Path) -> None:
        self.checkpoint = path

    def _safely(self, log: Callable[[], None]) -> None:
        try:
            log()
        except Exception as e:
            if not self.failed:  # once: an outage would say it at every log
                warnings.warn(f"{type(self).__name__} could not log ({type(e).__name__}: {e}); "
                              "the run goes on, and its own files have everything",
                              Notice, stacklevel=2)  # fmt: skip
            self.failed = True

    def artifacts(self) -> list[Path]:
        """What a tracker stores at the end: the latest checkpoint (unless it is too large to
        send, as a replay table makes it) and the run's videos."""
        assert self.info is not None
        videos = sorted(p for p in self.info.path.rglob("*") if p.suffix in (".mp4", ".gif")
                        and "wandb" not in p.relative_to(self.info.path).parts)  # fmt: skip
        checkpoint = self.checkpoint
        if checkpoint is not None and checkpoint.stat().st_size > MAX_ARTIFACT_BYTES:
            warnings.warn(f"{checkpoint} ({checkpoint.stat().st_size / 2**20:,.0f} MiB) is not "
                          "sent to the tracker; it stays in the run directory", Notice,
                          stacklevel=2)  # fmt: skip
            checkpoint = None
        return ([checkpoint] if checkpoint is not None else []) + videos


MAX_ARTIFACT_BYTES = 256 * 2**20  # a checkpoint with its replay tables can hold gigabytes


class WandbTracker(_Tracker):
    """Logs the run to Weights & Biases (``wandb.init`` with the run's record as its config)."""

    def __init__(self, project: str = "rlherd", **init: Any):
        super().__init__()
        self.project, self.init = project, init
        self.wandb: Any = None

    def on_start(self, run: RunInfo) -> None:
        import wandb

        self.wandb, self.info, ids = wandb, run, _Ids(run.path)
        run_id = ids.get("wandb") or uuid.uuid4().hex[:12]
        try:
            self.run = wandb.init(project=self.project, name=run.path.name, dir=str(run.path),
                                  config=run.record, id=run_id, resume="allow",
                                  **self.init)  # fmt: skip
        except (wandb.errors.UsageError, wandb.errors.CommError) as e:  # not logged in, offline
            raise ConfigError(f"--track wandb: {str(e).splitlines()[0]} (wandb login, or "
                              "WANDB_MODE=offline to keep the run on this machine)") from None
        self.run.define_metric(run.counts)
        self.run.define_metric("*", step_metric=run.counts)
        ids.set("wandb", run_id)

    def on_log(self, metrics: dict[str, Any]) -> None:
        self._safely(lambda: self.run.log(logged(metrics)))

    def on_eval(self, results: dict[str, Any]) -> None:
        self._safely(lambda: self.run.log(numbers_of(results)))

    def on_end(self, summary: dict[str, Any]) -> None:
        self._safely(lambda: self._store(summary))
        self.run.finish(exit_code=0 if summary.get("error") is None else 1)

    def _store(self, summary: dict[str, Any]) -> None:
        self.run.summary.update(numbers_of(summary))
        files = self.artifacts()
        if files:
            artifact = self.wandb.Artifact(f"{self.run.id}-files", type="model")
            for path in files:
                artifact.add_file(str(path))
            self.run.log_artifact(artifact)


class MlflowTracker(_Tracker):
    """Logs the run to MLflow, through its client (no global active run, so runs in one
    process do not share one)."""

    def __init__(self, uri: str | None = None, experiment: str = "rlherd"):
        super().__init__()
        self.uri, self.experiment = uri, experiment

    def on_start(self, run: RunInfo) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self._start(run)
        except MlflowException as e:  # a store it cannot use, a server it cannot reach
            raise ConfigError(f"--track mlflow: {e.message.splitlines()[0]} (--track-uri "
                              "sets where MLflow logs, e.g. sqlite:///mlflow.db)") from None

    def _start(self, run: RunInfo) -> None:
        from mlflow.tracking import MlflowClient

        self.client, self.info, ids = MlflowClient(tracking_uri=self.uri), run, _Ids(run.path)
        self.run_id = ids.get("mlflow")
        if self.run_id is None:
            found = self.client.get_experiment_by_name(self.experiment)
            experiment = (found.experiment_id if found is not None
                          else self.client.create_experiment(self.experiment))  # fmt: skip
            self.run_id = self.client.create_run(experiment, run_name=run.path.name).info.run_id
            ids.set("mlflow", self.run_id)
            for key, value in _flat(run.record).items():
                self.client.log_param(self.run_id, key, str(value)[:6000])
            self.client.log_dict(self.run_id, run.record, "config.json")
        else:
            self.client.update_run(self.run_id, status="RUNNING")

    def _log(self, metrics: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        assert self.info is not None
        step = int(metrics.get(self.info.counts, 0))
        values, now = numbers_of(metrics), int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[
            Metric(key, value, now, step)
            for key, value in values.items()])  # fmt: skip

    def on_log(self, metrics: dict[str, Any]) -> None:
        self._safely(lambda: self._log(logged(metrics)))

    def on_eval(self, results: dict[str, Any]) -> None:
        self._safely(lambda: self._log(results))

    def on_end(self, summary: dict[str, Any]) -> None:
        self._safely(lambda: self._store(summary))
        self.client.set_terminated(self.run_id,
                                   "FINISHED" if summary.get("error") is None else "FAILED")

    def _store(self, summary: dict[str, Any]) -> None:
        self.client.log_dict(self.run_id, summary, "summary.json")
        for path in self.artifacts():
            self.client.log_artifact(self.run_id, str(path))


def _flat(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"config": {"lr": 1}}`` as ``{"config.lr": 1}``: MLflow's params are flat."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def trackers(names: str, project: str = "rlherd", uri: str | None = None) -> list[Callback]:
    """The trackers ``--track`` names (``wandb``, ``mlflow``, comma-separated), each checked to
    be installed now, before a run directory is made. A project or URI given without a
    tracker to take it is refused, not ignored (the run would be logged nowhere)."""
    named = [n.strip() for n in names.split(",") if n.strip()]
    if not named and (project != "rlherd" or uri is not None):
        raise ConfigError("--track-project and --track-uri name where a tracker logs, and no "
                          "tracker is named: add --track wandb, mlflow or wandb,mlflow")
    if uri is not None and "mlflow" not in named:
        raise ConfigError("--track-uri is MLflow's tracking URI, and --track names no mlflow: "
                          "add it (--track mlflow)")
    made: list[Callback] = []
    for name in named:
        if name not in TRACKERS:
            raise ConfigError(f"unknown tracker {name!r}; --track takes {', '.join(TRACKERS)}")
        try:
            __import__(name)
        except ImportError:
            raise ConfigError(f"--track {name} needs {name}: pip install 'rlherd[track]'") from None
        made.append(WandbTracker(project) if name == "wandb" else MlflowTracker(uri, project))
    return made
