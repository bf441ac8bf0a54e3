"""``rlherd plot``: learning curves of one or more runs from their metrics/train.csv."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from rlherd.errors import ConfigError
from rlherd.run.rundir import make_folder, names_folder, run_file
from rlherd.run.statistics import CURVE_REPS, aggregate_curves, find_runs, group_runs

_FIX = "restore it from a copy of the run, or delete the row"


def load_curves(run_dir: str | Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Agent steps and the returns logged at them: ``{"": returns}``, or one curve per policy
    for games of several policies (``episode_return_tagger`` -> ``"tagger"``)."""
    path = Path(run_dir) / "metrics" / "train.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: no episode finished in {run_dir} yet?")
    header, rows = _rows(path)
    if not rows:  # no episode yet
        return np.zeros(0), {"": np.zeros(0)}
    prefix = "episode_return"
    columns = [c for c in header if c.startswith(prefix)]
    table = _numbers(path, header, rows, ["actor_steps", *columns])
    return table[:, 0], {c[len(prefix) + 1:]: table[:, i + 1] for i, c in enumerate(columns)}


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """A metrics CSV's header and rows, but a short last row: the one a run killed while it
    wrote it leaves. A file that is not CSV text is one line naming it."""
    try:
        with open(run_file(path), newline="", encoding="utf-8") as f:
            header, *rows = [*csv.reader(f)] or [[]]
    except (UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"{path} is not the CSV rlherd writes ({e}); restore it from a copy "
                          "of the run") from None  # fmt: skip
    if rows and len(rows[-1]) < len(header):
        rows.pop()
    return header, rows


def _numbers(path: Path, header: list[str], rows: list[list[str]],
             names: list[str]) -> np.ndarray:  # fmt: skip
    """The columns ``names`` of a metrics CSV's ``rows``, as numbers; a column missing, a row
    of another length than the header, or a value that is no number is one line naming the
    file and the row."""
    if missing := [name for name in names if name not in header]:
        raise ConfigError(f"{path} has no {missing[0]} column; restore it from a copy of the run")
    for r, row in enumerate(rows, start=1):
        if len(row) != len(header):
            raise ConfigError(f"{path}: row {r} has {len(row)} fields where the header has "
                              f"{len(header)}; {_FIX}")  # fmt: skip
    index = [header.index(name) for name in names]
    table = [[_number(path, r, header[i], row[i]) for i in index]
             for r, row in enumerate(rows, start=1)]  # fmt: skip
    return np.array(table, dtype=float).reshape(len(rows), len(names))


def _number(path: Path, r: int, column: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{path}: row {r} holds {text[:40]!r} as {column}, not a number; "
                          f"{_FIX}") from None  # fmt: skip


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` episodes (shorter at the start)."""
    cumsum = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(0, idx - window)
    return (cumsum[idx] - cumsum[lo]) / (idx - lo)


def plot_runs(
    run_dirs: list[str | Path],
    output: str | Path,
    window: int = 20,
    title: str | None = None,
    aggregate: str | None = None,
    reps: int = CURVE_REPS,
) -> Path:
    """Draw the runs' learning curves into ``output`` (a file, ``.png`` if it names no format,
    or a folder to write ``curves.png`` in: one that exists, or ``figures/``): each run's
    (``run_dirs`` may name folders of runs, such as the parent of ``--seeds`` runs), or with
    ``aggregate`` (``iqm`` or ``mean``) each experiment's aggregate over its seeds with a 95%
    bootstrap band (``reps`` resamples at each of 40 steps) over its seeds' own curves."""
    if not window >= 1:
        raise ConfigError(f"--window must be at least 1 episode, got {window}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if names_folder(output):  # a folder to draw in, as `cp` takes one
        output = Path(output) / "curves.png"
    output = Path(output)
    if not output.suffix:  # matplotlib's default format, said in the path printed
        output = output.with_name(f"{output.name}.png")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    formats = fig.canvas.get_supported_filetypes()
    if output.suffix.lstrip(".").lower() not in formats:  # before any run is read
        plt.close(fig)
        raise ConfigError(f"-o {output}: matplotlib writes {', '.join(sorted(formats))}; give "
                          f"one of those suffixes (e.g. curves.png)")  # fmt: skip
    if aggregate is None:
        for run in find_runs(run_dirs):
            steps, curves = load_curves(run.path)
            for policy, returns in curves.items():
                label = f"{run.path.name} {policy}".strip()
                ax.plot(steps, smooth(returns, window), label=label)
    elif not _plot_aggregates(ax, run_dirs, window, aggregate, reps):
        plt.close(fig)
        raise ConfigError(f"no run in {', '.join(map(str, run_dirs))} has finished an episode "
                          "yet (metrics/train.csv): no curve to draw")  # fmt: skip
    ax.set_xlabel("agent steps")
    ylabel = f"episode return (mean of last {window})"
    if aggregate is not None:
        ylabel += f"\n{aggregate.upper() if aggregate == 'iqm' else aggregate} over seeds, 95% CI"
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    output = make_folder(output.parent, "-o") / output.name
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output


def _plot_aggregates(ax, run_dirs: list[str | Path], window: int, kind: str, reps: int) -> int:
    """Per experiment (and policy): its seeds' smoothed curves, thin, and their ``kind`` on a
    common step grid, bold, in a band of its 95% bootstrap confidence interval. Runs with no
    episode yet are left out; the number of curves drawn."""
    color = 0
    for group in group_runs(find_runs(run_dirs)):
        loaded = [load_curves(run.path) for run in group.runs
                  if (run.path / "metrics" / "train.csv").exists()]  # none yet: left out
        if not loaded:
            continue
        for policy in loaded[0][1]:
            curves = [(steps, smooth(c[policy], window)) for steps, c in loaded if len(steps)]
            if not curves:
                continue
            agg = aggregate_curves(curves, kind, reps=reps)
            style = dict(color=f"C{color}")
            for returns in agg.runs:
                ax.plot(agg.steps, returns, alpha=0.25, linewidth=0.8, **style)
            label = f"{group.label} {policy}".strip() + f" ({len(curves)} seeds)"
            ax.plot(agg.steps, agg.value, linewidth=2, label=label, **style)
            if agg.low is not None:
                ax.fill_between(agg.steps, agg.low, agg.high, alpha=0.2, linewidth=0, **style)
            color += 1
    return color
