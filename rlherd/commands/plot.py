"""``rlherd plot``: learning curves of one or more runs from their metrics/train.csv."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from rlherd.errors import ConfigError
from rlherd.run.rundir import make_folder, run_file
from rlherd.run.statistics import CURVE_REPS, aggregate_curves, find_runs, group_runs


def load_curves(run_dir: str | Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Agent steps and the returns logged at them: ``{"": returns}``, or one curve per policy
    for games of several policies (``episode_return_tagger`` -> ``"tagger"``)."""
    path = Path(run_dir) / "metrics" / "train.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: no episode finished in {run_dir} yet?")
    with open(run_file(path), newline="") as f:
        rows = list(csv.DictReader(f))
    prefix = "episode_return"
    columns = [c for c in (rows[0] if rows else {prefix: ""}) if c.startswith(prefix)]
    steps = np.array([float(r["actor_steps"]) for r in rows])
    curves = {c[len(prefix) + 1:]: np.array([float(r[c]) for r in rows]) for c in columns}
    return steps, curves


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
    or a folder to write ``curves.png`` in): each run's (``run_dirs`` may name
    folders of runs, such as the parent of ``--seeds`` runs), or with ``aggregate`` (``iqm``
    or ``mean``) each experiment's aggregate over its seeds with a 95% bootstrap band
    (``reps`` resamples at each of 40 steps) over its seeds' own curves."""
    if not window >= 1:
        raise ConfigError(f"--window must be at least 1 episode, got {window}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output = Path(output)
    if output.is_dir():  # a folder to draw in, as `cp` takes one
        output = output / "curves.png"
    elif not output.suffix:  # matplotlib's default format, said in the path printed
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
    else:
        _plot_aggregates(ax, run_dirs, window, aggregate, reps)
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


def _plot_aggregates(ax, run_dirs: list[str | Path], window: int, kind: str, reps: int) -> None:
    """Per experiment (and policy): its seeds' smoothed curves, thin, and their ``kind`` on a
    common step grid, bold, in a band of its 95% bootstrap confidence interval."""
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
