"""Callbacks: code of yours that a run calls as it goes, and that may stop it.

A callback is any object with some of these methods (:class:`Callback` has them all, doing
nothing, to subclass):

- ``on_start(run)``: the run begins (or resumes); ``run`` is a :class:`RunInfo`.
- ``on_log(metrics)``: every log interval (``--log-interval-s``) and once at the end, with what
  ``summary.json`` says then (counters, ``sps``, ``final_return_mean``) and the learner's mean
  metrics since the last log, named as in the run's ``metrics/learner.csv`` (they differ by
  agent: IMPALA's ``total_loss``, PPO's ``policy_loss`` and ``value_loss``, ...).
- ``on_eval(results)``: an evaluation finished: the ``metrics/evaluator.csv`` row (the step
  count, ``eval_return_mean``, ...).
- ``on_checkpoint(path)``: a checkpoint was written to ``path``.
- ``on_end(summary)``: the run ended, with its final summary.

Any of the first four may return ``"stop"``: the run then stops at its next safe point as it
does on Ctrl-C (a final checkpoint, every process joined), but it has *finished*: its summary
says which callback stopped it and why (``stopped_by``), ``rlherd train`` exits 0, and
``--resume`` with a larger ``--total-steps`` continues it.

Why in the run's kit and not in the runtimes: every runtime already reports its counters, its
learner's metrics, its evaluations and its checkpoints to the driver's
:class:`~rlherd.run.recorder.Recorder` and evaluator, so callbacks fire there, in the driver (or
learner) process, from numbers already gathered. They cost nothing per environment step, and no
runtime has code for them.

Example::

    import rlherd
    from rlherd.run.callbacks import Callback, StopAtReturn

    class Print(Callback):
        def on_eval(self, results):
            print(results["actor_steps"], results["eval_return_mean"])

    run = rlherd.train("ppo", "CartPole-v1", eval_every=5_000,
                       callbacks=[Print(), StopAtReturn(475)])
    print(run.summary["stopped_by"])  # "StopAtReturn: eval_return_mean 500.0 >= 475"
"""

from __future__ import annotations

import math
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rlherd.errors import ConfigError
from rlherd.run.rundir import RETURN_WINDOW, RunDir, read_json

STOP = "stop"
Answer = Literal["stop"] | None


class Callback:
    """Hooks that do nothing: subclass and override the ones you need. Each may return
    ``"stop"`` (except :meth:`on_end`); set :attr:`reason` before it does to say why."""

    reason: str = ""  # why the callback stopped the run, for the summary's ``stopped_by``
    needs_evaluations: bool = False  # True: a run without evaluations (eval_every 0) is refused

    def on_start(self, run: RunInfo) -> Answer:
        return None

    def on_log(self, metrics: dict[str, Any]) -> Answer:
        return None

    def on_eval(self, results: dict[str, Any]) -> Answer:
        return None

    def on_checkpoint(self, path: Path) -> Answer:
        return None

    def on_end(self, summary: dict[str, Any]) -> None:
        return None


@dataclass
class RunInfo:
    """What a callback is told of the run at its start: its directory, its record (agent, env,
    runtime, seed, config, settings, as ``config.json`` holds them), whether it resumes, and
    the counter its steps are counted in (``actor_steps``; offline ``learner_steps``)."""

    path: Path
    record: dict[str, Any]
    resumed: bool
    counts: str
    # During ``on_eval``: the evaluated policy's parameters (a state dict that loads into the
    # agent's networks), read on demand; None at other times.
    evaluated_policy: Callable[[], dict[str, Any]] | None = field(default=None, repr=False)


class Callbacks:
    """The run's callbacks, called in order. The first ``"stop"`` sets the run's stop event and
    is kept as :attr:`stopped_by`; a callback that raises stops the run with its traceback (an
    unexpected bug in it is no reason to train on without it)."""

    def __init__(self, callbacks: Iterable[Any], stop: threading.Event):
        self.callbacks = list(callbacks)
        self.stop = stop
        self.stopped_by: str | None = None
        self.info: RunInfo | None = None
        self.started: list[Any] = []  # those whose start went well: they hear the end

    def _call(self, hook: str, argument: Any) -> None:
        for callback in self.callbacks:
            method = getattr(callback, hook, None)
            answer = None if method is None else method(argument)
            if hook == "on_start":
                self.started.append(callback)
            if answer == STOP and hook != "on_end" and self.stopped_by is None:
                reason = getattr(callback, "reason", "")
                name = type(callback).__name__
                self.stopped_by = f"{name}: {reason}" if reason else f"{name}.{hook}"
                self.stop.set()
            elif answer not in (None, STOP):
                raise ConfigError(f"{type(callback).__name__}.{hook} returned {answer!r}; a "
                                  'callback returns None or "stop"')

    def on_start(self, info: RunInfo) -> None:
        self.info = info
        self._call("on_start", info)

    def on_log(self, metrics: dict[str, Any]) -> None:
        self._call("on_log", metrics)

    def on_eval(self, results: dict[str, Any], policy: Callable[[], dict[str, Any]]) -> None:
        """``policy()`` reads the evaluated parameters, for callbacks that keep them."""
        if self.info is not None:
            self.info.evaluated_policy = policy
        try:
            self._call("on_eval", results)
        finally:
            if self.info is not None:
                self.info.evaluated_policy = None

    def on_checkpoint(self, path: Path) -> None:
        self._call("on_checkpoint", path)

    def on_end(self, summary: dict[str, Any]) -> None:
        """Every callback that started hears the end, even when one before it fails (a tracker
        must close its run); the first failure is raised after."""
        failed: BaseException | None = None
        for callback in self.started:
            method = getattr(callback, "on_end", None)
            try:
                if method is not None:
                    method(summary)
            except Exception as e:  # each callback in turn, whatever the others do
                failed = failed or e
                traceback.print_exc()
        if failed is not None:
            raise failed


HOOKS = ("on_start", "on_log", "on_eval", "on_checkpoint", "on_end")


def _watch(watching: list[str]) -> str:
    """The verb for ``watching`` callbacks: one watches, several watch."""
    return "watches" if len(watching) == 1 else "watch"


def check_callbacks(callbacks: Iterable[Any], eval_every: int, total_steps: int) -> None:
    """Refuse, before a run starts, an object that is no callback, and callbacks that watch
    evaluations in a run that has none (``eval_every`` 0, or above ``total_steps``)."""
    for callback in callbacks:
        if not any(callable(getattr(callback, hook, None)) for hook in HOOKS):
            raise ConfigError(f"callback {callback!r} has none of the methods "
                              f"{', '.join(HOOKS)}; subclass rlherd.run.callbacks.Callback")
    watching = [type(c).__name__ for c in callbacks if getattr(c, "needs_evaluations", False)]
    if watching and eval_every <= 0:
        raise ConfigError(f"{', '.join(watching)} {_watch(watching)} evaluations, and this run "
                          "has none: set --eval-every N (eval_every=N)")  # fmt: skip
    if watching and eval_every > total_steps:
        raise ConfigError(f"{', '.join(watching)} {_watch(watching)} evaluations, and this run of "
                          f"{total_steps} steps has none (--eval-every {eval_every}): set "
                          f"--eval-every N with N <= {total_steps}")  # fmt: skip


def _better(value: float, best: float | None, mode: str, min_delta: float) -> bool:
    if best is None:
        return True
    return value > best + min_delta if mode == "max" else value < best - min_delta


def _metric(results: dict[str, Any], metric: str, who: str) -> float | None:
    if metric not in results:
        have = ", ".join(k for k in results if "return" in k) or ", ".join(results)
        raise ConfigError(f"{who} watches {metric!r}, which the run does not report (it "
                          f"reports {have}); pass metric=...")
    value = results[metric]
    return None if value is None or not math.isfinite(value) else float(value)


class StopAtReturn(Callback):
    """Stop once ``metric`` reaches ``threshold``: by default the evaluation's mean return
    (so set ``eval_every``); ``metric="final_return_mean"`` (or a game's
    ``final_return_mean_<policy>``) watches the training episodes' (the mean of the last 20),
    checked every log interval instead, once its window is full (``final_return_window``):
    before that the "mean" is of the first few, and one lucky episode would stop a run that
    has learned nothing. A game of several policies has no ``final_return_mean`` of them all:
    watching it there is refused at the first log."""

    def __init__(self, threshold: float, metric: str = "eval_return_mean"):
        if not math.isfinite(threshold):  # never reached
            raise ConfigError(f"StopAtReturn's threshold must be a finite return, got {threshold}")
        self.threshold, self.metric = threshold, metric
        self.needs_evaluations = metric.startswith("eval_")

    def _check(self, results: dict[str, Any]) -> Answer:
        value = _metric(results, self.metric, "StopAtReturn")
        if value is not None and value >= self.threshold:
            self.reason = f"{self.metric} {value:g} >= {self.threshold:g}"
            return STOP
        return None

    def on_eval(self, results: dict[str, Any]) -> Answer:
        return self._check(results) if self.metric.startswith("eval_") else None

    def on_log(self, metrics: dict[str, Any]) -> Answer:
        if self.metric.startswith("eval_"):
            return None
        if self.metric.startswith("final_return_mean"):  # final_return_window(_<policy>)
            window = "final_return_window" + self.metric.removeprefix("final_return_mean")
            policies = [k.removeprefix("final_return_window_") for k in metrics
                        if k.startswith("final_return_window_")]  # fmt: skip
            if self.metric == "final_return_mean" and policies:
                raise ConfigError(
                    "StopAtReturn watches final_return_mean, which a game of several policies "
                    "never has (each policy has its own return): pass metric="
                    f"{' or '.join('final_return_mean_' + p for p in policies)}"
                )
            # A game's policies' windows are there, empty, from the start (a policy's first
            # episode may end long after others'): a name without one is not the run's.
            if metrics.get(window, RETURN_WINDOW) < RETURN_WINDOW:
                return None
        return self._check(metrics)


class StopWithoutImprovement(Callback):
    """Stop when ``patience`` evaluations in a row have not improved on the best ``metric``
    by more than ``min_delta`` (``mode="min"`` for a metric to lower)."""

    needs_evaluations = True

    def __init__(self, patience: int, metric: str = "eval_return_mean", min_delta: float = 0.0,
                 mode: str = "max"):  # fmt: skip
        if patience < 1 or mode not in ("max", "min"):
            raise ConfigError("StopWithoutImprovement needs patience >= 1 and mode max or min")
        self.patience, self.metric, self.min_delta, self.mode = patience, metric, min_delta, mode
        self.best: float | None = None
        self.since_best = 0

    def on_eval(self, results: dict[str, Any]) -> Answer:
        value = _metric(results, self.metric, "StopWithoutImprovement")
        if value is not None and _better(value, self.best, self.mode, self.min_delta):
            self.best, self.since_best = value, 0
            return None
        self.since_best += 1
        if self.since_best >= self.patience:
            self.reason = (f"{self.metric} has not improved on {self.best} in "
                           f"{self.since_best} evaluations")  # fmt: skip
            return STOP
        return None


class SaveBest(Callback):
    """Keep the policy of the best evaluation so far (by ``metric``) in the run directory:
    ``best/policy.pt`` (its parameters, as plain data, like a checkpoint's) and
    ``best/evaluation.json`` (the evaluation's row). ``rlherd eval RUN --best`` and
    ``rlherd.load_policy(RUN, best=True)`` act with it."""

    needs_evaluations = True

    def __init__(self, metric: str = "eval_return_mean", mode: str = "max"):
        self.metric, self.mode = metric, mode
        self.best: float | None = None
        self.info: RunInfo | None = None

    def on_start(self, run: RunInfo) -> Answer:
        self.info = run
        saved = run.path / "best" / "evaluation.json"
        if run.resumed and saved.exists():  # a resumed run keeps the best it had
            self.best = read_json(saved).get(self.metric)
        return None

    def on_eval(self, results: dict[str, Any]) -> Answer:
        value = _metric(results, self.metric, "SaveBest")
        if value is None or not _better(value, self.best, self.mode, 0.0):
            return None
        assert self.info is not None and self.info.evaluated_policy is not None
        RunDir(self.info.path).save_best(self.info.evaluated_policy(), results)
        self.best = value
        return None
