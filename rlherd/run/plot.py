"""``rlherd plot``: learning curves of one or more runs from their metrics/train.csv."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


def load_curve(run_dir: str | Path) -> tuple[np.ndarray, np.ndarray]:
    path = Path(run_dir) / "metrics" / "train.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: no episode finished in {run_dir} yet?")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    steps = np.array([float(r["actor_steps"]) for r in rows])
    returns = np.array([float(r["episode_return"]) for r in rows])
    return steps, returns


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` episodes (shorter at the start)."""
    cumsum = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(0, idx - window)
    return (cumsum[idx] - cumsum[lo]) / (idx - lo)


def plot_runs(run_dirs: list[str | Path], output: str | Path, window: int = 20) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run_dir in run_dirs:
        steps, returns = load_curve(run_dir)
        ax.plot(steps, smooth(returns, window), label=Path(run_dir).name)
    ax.set_xlabel("agent steps")
    ax.set_ylabel(f"episode return (mean of last {window})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    output = Path(output)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output
