"""``rlherd plot``: learning curves of one or more runs from their metrics/train.csv."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


def load_curves(run_dir: str | Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Agent steps and the returns logged at them: ``{"": returns}``, or one curve per policy
    for games of several policies (``episode_return_tagger`` -> ``"tagger"``)."""
    path = Path(run_dir) / "metrics" / "train.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: no episode finished in {run_dir} yet?")
    with open(path, newline="") as f:
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
    run_dirs: list[str | Path], output: str | Path, window: int = 20, title: str | None = None
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run_dir in run_dirs:
        steps, curves = load_curves(run_dir)
        for policy, returns in curves.items():
            label = f"{Path(run_dir).name} {policy}".strip()
            ax.plot(steps, smooth(returns, window), label=label)
    ax.set_xlabel("agent steps")
    ax.set_ylabel(f"episode return (mean of last {window})")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    output = Path(output)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output
