"""``rlherd report RUNS...``: the final returns of experiments over seeds, as a table.

One row per experiment (and per policy in a game of several): how many runs, which return was
read, the interquartile mean (IQM) and the mean with their 95% stratified-bootstrap confidence
intervals (rliable; see :mod:`rlherd.run.statistics`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlherd.run.rundir import RETURN_WINDOW
from rlherd.run.statistics import (
    BOOTSTRAP_SEED,
    REPS,
    Estimate,
    aggregate,
    final_returns,
    find_runs,
    group_runs,
)


def report(paths: Sequence[str | Path], reps: int = REPS,
           seed: int = BOOTSTRAP_SEED) -> list[dict[str, Any]]:  # fmt: skip
    """One row per experiment and policy found in ``paths`` (run directories or folders of
    them): its runs, their seeds and final returns, the IQM and mean with 95% CIs (``reps``
    bootstrap resamples from ``seed``). Runs with no finished episode yet are left out and
    listed under ``left_out``."""
    rows = []
    for group in group_runs(find_runs(paths)):
        for policy in group.policies:
            returns = final_returns(group, policy)
            with_none = [str(run.path) for run in group.runs if run not in returns.runs]
            row: dict[str, Any] = {
                "group": group.label, "agent": group.key.get("agent"),
                "env": group.key.get("env"), "policy": policy or None,
                "runs": len(returns.values), "return": returns.metric,
                "eval_episodes": sorted({run.summary.get("eval_episodes") for run in returns.runs}
                                        - {None}) if returns.metric.startswith("eval_") else [],
                "seeds": [run.seed for run in returns.runs], "returns": returns.values,
                "run_dirs": [str(run.path) for run in returns.runs], "left_out": with_none,
            }  # fmt: skip
            if returns.values:
                for name, estimate in aggregate(returns.values, reps, seed).items():
                    row[name] = estimate.value
                    row[f"{name}_ci"] = _interval(estimate)
            rows.append(row)
    return rows


def _interval(estimate: Estimate) -> list[float] | None:
    return None if estimate.low is None else [estimate.low, estimate.high]


def print_table(rows: list[dict[str, Any]], reps: int) -> None:
    """The rows as a table, and under it what its words mean."""
    from rich.console import Console
    from rich.table import Table

    policies = any(row["policy"] for row in rows)
    table = Table(title="final returns over seeds")
    columns = ["experiment", "agent", "env", *(["policy"] if policies else []), "runs", "return",
               "IQM", "95% CI", "mean", "95% CI"]  # fmt: skip
    for name in columns:
        table.add_column(name, justify="right" if name in ("runs", "IQM", "mean", "95% CI")
                         else "left")  # fmt: skip
    for row in rows:
        policy = [row["policy"] or ""] if policies else []
        table.add_row(row["group"], row["agent"], row["env"], *policy, str(row["runs"]),
                      _source(row), *_cells(row, "iqm"), *_cells(row, "mean"))
    # Piped or written to a file, a table keeps its width (rich would fold it into 80 columns).
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(table)
    notes = [
        "return: eval (N) = the greedy policy's mean return over N episodes at the run's last "
        "evaluation (eval_return_*, by the evaluator or rlherd eval); train = the mean return "
        f"of its last {RETURN_WINDOW} training episodes (final_return_mean*), used where not "
        "every run of the experiment evaluated.",
        "IQM: the mean of the middle 50% of runs (robust to an outlier seed); CI: 95% "
        f"stratified bootstrap over runs (rliable, {reps} resamples).",
    ]
    if any(row["runs"] == 1 for row in rows):
        notes.append("n/a: one run has no interval; train more seeds (--seeds 1-5).")
    for row in rows:
        if row["left_out"]:
            notes.append(f"left out of {row['group']} (no episode finished yet): "
                         f"{', '.join(row['left_out'])}")  # fmt: skip
    for note in notes:
        console.print(note, style="dim", highlight=False)


def _source(row: dict[str, Any]) -> str:
    if not row["return"].startswith("eval_"):
        return "train"
    episodes = "/".join(map(str, row["eval_episodes"]))
    return f"eval ({episodes})" if episodes else "eval"


def _cells(row: dict[str, Any], name: str) -> tuple[str, str]:
    """The aggregate ``name`` of a row and its interval, as table cells."""
    if name not in row:
        return "no return yet", ""
    ci = row[f"{name}_ci"]
    return f"{row[name]:.2f}", f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "n/a"
