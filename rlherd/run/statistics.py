"""Runs of one experiment over seeds, and what they say together: the interquartile mean (IQM)
and the mean of their final returns, and of their learning curves, with stratified-bootstrap
confidence intervals, as rliable computes them (Agarwal et al., 2021, "Deep reinforcement
learning at the edge of the statistical precipice"). ``rlherd report`` and ``rlherd plot
--aggregate`` print and draw them.

Runs are grouped by what they ran (agent, environment, runtime, budget, config and settings:
everything in config.json but the seed and the machine), so the runs given in any order or
folder fall into their experiments. A run's final return is its last evaluation's mean return
(``eval_return_mean``: the greedy policy on fixed evaluation seeds) where the run evaluated,
else the mean return of its last 20 training episodes (``final_return_mean``); a game of
several policies has one of each per policy.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlherd.errors import ConfigError, MissingExtra
from rlherd.run.rundir import PACKAGE_KEY, read_json

REPS = 2000  # bootstrap resamples of a final-return interval
# A curve's band is an interval at each of its points: rliable's IQM (scipy's trim_mean, ~0.1 ms
# a call on the 2-core machine) of reps x points resamples takes seconds; 40 x 500 keep it ~2 s.
CURVE_POINTS, CURVE_REPS = 40, 500
BOOTSTRAP_SEED = 0  # the same runs always give the same interval
CONFIDENCE = 0.95
AGGREGATES = ("iqm", "mean")
NOT_COMPARED = ("seed", "machine")  # config.json fields that seeds of one experiment differ in


def rliable() -> tuple[Any, Any]:
    """rliable's ``library`` and ``metrics`` modules, or one line naming the extra.

    rliable 1.2 needs ``arch<8``, and arch 7 fails to import under pandas 3 (a TypeError, not
    an ImportError); the ``stats`` extra pins pandas below 3, so its install fixes both."""
    try:
        from rliable import library, metrics
    except (ImportError, TypeError) as e:
        raise MissingExtra(f'statistics over seeds need rliable, which did not import ({e}): '
                           'pip install "rlherd[stats]"') from None  # fmt: skip
    return library, metrics


@dataclass
class RunFiles:
    """A run as ``report`` and ``plot`` read it: its config.json and summary.json, as JSON
    (they run nothing, so they need nothing installed that the run used)."""

    path: Path
    config: dict[str, Any]
    summary: dict[str, Any]

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", 0))


@dataclass
class Group:
    """The runs of one experiment: the same config.json but for the seed."""

    label: str  # how tables and legends name it: the folder its runs share
    key: dict[str, Any]  # the config they share
    runs: list[RunFiles] = field(default_factory=list)

    @property
    def policies(self) -> list[str]:
        """The policies with a return of their own: ``[""]`` for one policy, else the names
        of a game's policies (``final_return_mean_tagger`` -> ``"tagger"``)."""
        prefix = "final_return_mean_"
        names = {k[len(prefix):] for run in self.runs for k in run.summary if k.startswith(prefix)}
        return sorted(names) or [""]


def find_runs(paths: Sequence[str | Path]) -> list[RunFiles]:
    """The runs in ``paths``: each a run directory, or a folder holding runs at any depth (the
    parent of ``--seeds`` runs, or ``runs/``). A run given twice (or within a folder given too)
    is found once; packages (``rlherd package``) are copies of a run's policy, not runs, and
    would count one run as several seeds."""
    found: dict[Path, RunFiles] = {}
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist; give run directories or folders "
                                    "that hold them")  # fmt: skip
        if not path.is_dir():
            raise ConfigError(f"{path} is a file; give run directories or folders that hold "
                              "them")  # fmt: skip
        if _is_package(path):
            raise ConfigError(f"{path} is a package (rlherd package), a copy of a run's policy; "
                              "give the run directory it was made from")  # fmt: skip
        runs = [RunFiles(d, read_json(d / "config.json"), _summary(d)) for d in _run_dirs(path)]
        if not runs:
            raise ConfigError(f"{path} holds no run (a run directory has a config.json); give "
                              "run directories or folders that hold them")  # fmt: skip
        for run in runs:
            found.setdefault(run.path.resolve(), run)
    return list(found.values())


def _run_dirs(path: Path) -> Iterator[Path]:
    if (path / "config.json").is_file():
        if not _is_package(path):
            yield path
        return
    for child in sorted(p for p in path.iterdir() if p.is_dir()):
        yield from _run_dirs(child)


def _is_package(path: Path) -> bool:
    """A package's config.json is a run's with the package's own entry
    (:data:`rlherd.run.rundir.PACKAGE_KEY`). Not :func:`rlherd.run.package.is_package`, which
    takes any folder without checkpoints for one: kept bsuite runs, which reports read, too."""
    return (path / "config.json").is_file() and PACKAGE_KEY in read_json(path / "config.json")


def _summary(path: Path) -> dict[str, Any]:
    """The run's summary.json; before its first one, an empty summary (it has no return yet)."""
    return read_json(path / "summary.json") if (path / "summary.json").exists() else {}


def group_runs(runs: Sequence[RunFiles]) -> list[Group]:
    """``runs`` (:func:`find_runs`'s) grouped by experiment, in the order their first runs
    were given. Seeds within a group are in order."""
    groups: dict[str, Group] = {}
    for run in runs:
        key = {k: v for k, v in run.config.items() if k not in NOT_COMPARED}
        text = json.dumps(key, sort_keys=True, default=str)
        groups.setdefault(text, Group("", key)).runs.append(run)
    for group in groups.values():
        group.runs.sort(key=lambda run: run.seed)
        paths = [str(run.path.resolve()) for run in group.runs]
        common = os.path.commonpath(paths) if len(paths) > 1 else paths[0]
        group.label = _relative(Path(common))
    _tell_apart(list(groups.values()))
    return list(groups.values())


def _relative(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd())) or "."
    return str(path)


def _tell_apart(groups: list[Group]) -> None:
    """Groups whose runs share a folder (``rlherd report runs``) are labelled with what they
    differ in, too (``runs (learning_rate=0.001)``)."""
    by_label: dict[str, list[Group]] = {}
    for group in groups:
        by_label.setdefault(group.label, []).append(group)
    for same in (g for g in by_label.values() if len(g) > 1):
        flat = [_flat(group.key) for group in same]
        keys = sorted({k for f in flat for k in f if len({json.dumps(x.get(k)) for x in flat}) > 1})
        for group, values in zip(same, flat, strict=True):
            differs = ", ".join(f"{k.rpartition('.')[2]}={values.get(k)}" for k in keys[:3])
            group.label += f" ({differs}{', ...' if len(keys) > 3 else ''})"


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(value, dict):
        return {prefix: value}
    out = {}
    for k, v in value.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else k))
    return out


@dataclass
class FinalReturns:
    """The final returns of one group's runs for one policy, and which return they are."""

    group: Group
    policy: str  # "" for a run of one policy
    metric: str  # the summary.json field read: eval_return_mean, final_return_mean, ...
    values: list[float]
    runs: list[RunFiles]  # the runs with a return (a run with no episode yet has none)


def final_returns(group: Group, policy: str) -> FinalReturns:
    """Each run's final return for ``policy``: its last evaluation's mean where every run of the
    group evaluated (the same measure for all), else its last 20 training episodes' mean."""
    train = f"final_return_mean_{policy}" if policy else "final_return_mean"
    evaluated = f"eval_return_{policy}" if policy else "eval_return_mean"
    metric = evaluated if all(evaluated in run.summary for run in group.runs) else train
    runs = [run for run in group.runs if run.summary.get(metric) is not None]
    return FinalReturns(group, policy, metric, [_number(run, metric) for run in runs], runs)


def _number(run: RunFiles, metric: str) -> float:
    """The run's summary's ``metric``; anything but a number there is one line naming the file."""
    value = run.summary[metric]
    if type(value) not in (int, float):
        raise ConfigError(f"{run.path / 'summary.json'}: {metric} is {str(value)[:40]!r}, not a "
                          "number; restore it from a copy of the run")  # fmt: skip
    return float(value)


@dataclass
class Estimate:
    """An aggregate of runs' scores and its confidence interval (None for a single run: a
    bootstrap of one value says nothing about another seed)."""

    value: float
    low: float | None
    high: float | None


def iqm_and_mean(scores: np.ndarray) -> np.ndarray:
    """``[IQM, mean]`` of a ``runs x tasks`` score matrix, as rliable defines them."""
    _, metrics = rliable()
    return np.array([metrics.aggregate_iqm(scores), metrics.aggregate_mean(scores)])


def aggregate(values: Sequence[float], reps: int = REPS,
              seed: int = BOOTSTRAP_SEED) -> dict[str, Estimate]:  # fmt: skip
    """The IQM and the mean of ``values`` (one final return per run) with their 95% stratified
    bootstrap confidence intervals (rliable's ``get_interval_estimates``, ``reps`` resamples)."""
    scores = np.asarray(values, dtype=np.float64).reshape(-1, 1)  # runs x 1 task
    if len(scores) == 0:
        raise ConfigError("no run has a final return yet (no episode finished)")
    point, low, high = _interval_estimates(scores, iqm_and_mean, reps, seed)
    return {name: Estimate(float(point[i]), low if low is None else float(low[i]),
                           high if high is None else float(high[i]))
            for i, name in enumerate(AGGREGATES)}  # fmt: skip


def _interval_estimates(scores: np.ndarray, func: Callable[[np.ndarray], np.ndarray],
                        reps: int, seed: int):  # fmt: skip
    """``func(scores)`` and its interval bounds, resampling runs (the first axis) with rliable;
    no interval for one run.

    rliable's StratifiedBootstrap draws its resamples from numpy's global generator
    (``np.random.choice``; its ``random_state`` is arch's, which it does not use), so the fixed
    ``seed`` is set there, and numpy's global state is put back afterwards."""
    library, _ = rliable()
    if reps < 1:
        raise ConfigError(f"--reps must be at least 1, got {reps}")
    if len(scores) < 2:
        return func(scores), None, None
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        point, interval = library.get_interval_estimates(
            {"runs": scores}, func, reps=reps, confidence_interval_size=CONFIDENCE)
    finally:
        np.random.set_state(state)
    return point["runs"], interval["runs"][0], interval["runs"][1]


@dataclass
class Curves:
    """Runs' learning curves on one step grid, their aggregate at each step, and its band."""

    steps: np.ndarray  # [points]
    runs: np.ndarray  # [runs, points]: each run's smoothed return, interpolated
    value: np.ndarray  # [points]
    low: np.ndarray | None  # [points]; None for one run
    high: np.ndarray | None


def aggregate_curves(curves: Sequence[tuple[np.ndarray, np.ndarray]], kind: str,
                     points: int = CURVE_POINTS, reps: int = CURVE_REPS,
                     seed: int = BOOTSTRAP_SEED) -> Curves:  # fmt: skip
    """The ``kind`` (iqm or mean) over runs of their curves ``(steps, returns)``, at ``points``
    steps spread over the span every run covers (no run's curve is extended past its data),
    with a 95% bootstrap band over runs at each step."""
    if kind not in AGGREGATES:
        raise ConfigError(f"--aggregate {kind!r}: choose {' or '.join(AGGREGATES)}")
    _, metrics = rliable()
    first = max(float(steps[0]) for steps, _ in curves)
    last = min(float(steps[-1]) for steps, _ in curves)
    if last < first:
        raise ConfigError("the runs' curves share no span of steps (one ends before another "
                          "starts); train them longer, or plot without --aggregate")
    grid = np.linspace(first, last, points) if last > first else np.array([last])
    runs = np.stack([np.interp(grid, steps, values) for steps, values in curves])
    metric = metrics.aggregate_iqm if kind == "iqm" else metrics.aggregate_mean

    def at_each_step(scores: np.ndarray) -> np.ndarray:  # scores: runs x 1 task x points
        return np.array([metric(scores[..., j]) for j in range(scores.shape[-1])])

    value, low, high = _interval_estimates(runs[:, None, :], at_each_step, reps, seed)
    return Curves(grid, runs, value, low, high)
