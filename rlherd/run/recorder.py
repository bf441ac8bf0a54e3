"""Counters, metrics, summary.json and the progress bar of a run, shared by every runtime."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from rlherd.errors import TrainingDiverged
from rlherd.run.callbacks import Callbacks
from rlherd.run.counting import Counter
from rlherd.run.rundir import RETURN_WINDOW, RunDir

CHECKPOINT_SHARE = 0.05  # checkpoints may take at most this share of a run's time
MAX_UNREAD = 10_000  # learner steps' metrics kept unread; beyond, they are folded into one mean


def mean_metrics(rows: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """The metrics of many learner steps as one row: ``rows`` are ``(steps, metrics)`` pairs,
    each metric a number or a 0-d tensor (on any device) standing for the mean over its
    ``steps``. Floats and tensors become their step-weighted mean; an int (a count or a gauge,
    e.g. ``reconnects``) keeps its latest value. Tensors are read here, one read per metric per
    row, so a learner never waits on its device to report a step."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for _, metrics in rows for k in metrics):
        pairs = [(n, m[key]) for n, m in rows if key in m]
        values = [v for _, v in pairs]
        if all(isinstance(v, int) for v in values):
            out[key] = values[-1]
            continue
        device = next((v.device for v in values if isinstance(v, torch.Tensor)), "cpu")
        stacked = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device).detach()
                               for v in values])  # fmt: skip
        weights = torch.tensor([n for n, _ in pairs], dtype=torch.float64, device=device)
        out[key] = float((stacked * weights).sum() / weights.sum())
    return out


class Recorder:
    """Keeps the run's counters and writes what they say.

    Runtimes call :meth:`add_actor_steps`, :meth:`episodes` and :meth:`learner` as work happens
    (from any thread), and :meth:`tick` from their main loop; ``tick`` writes the learner's row
    (the mean of its steps since the last one), rewrites ``summary.json`` and refreshes the
    progress bar every ``log_interval_s``, and says when a checkpoint is due.

    ``counts`` is the counter that ``total_steps``, the progress bar, ``sps`` and the metric rows'
    step axis count: ``actor_steps``, or ``learner_steps`` where no actor runs (offline).
    """

    def __init__(
        self,
        rundir: RunDir,
        meta: dict[str, Any],
        total_steps: int,
        progress: bool = True,
        log_interval_s: float = 5.0,
        checkpoint_interval_s: float = 60.0,
        counts: str = "actor_steps",
        total_episodes: int = 0,
    ):
        self.rundir = rundir
        self.counts = counts
        self.meta = meta
        self.total_steps = total_steps
        self.total_episodes = total_episodes
        self.log_interval_s = log_interval_s
        self.checkpoint_every_s = checkpoint_interval_s  # as set; the interval may be longer
        self.checkpoint_interval_s = checkpoint_interval_s
        # The run's counts: actor_steps, learner_steps, learner_walltime (from the first learner
        # step), episodes, wall_time_s. Components count through children of this Counter.
        self.counter = Counter()
        self.counter.set(
            actor_steps=0, learner_steps=0, episodes=0, wall_time_s=0.0, learner_walltime=0.0
        )
        self.actor_counter = Counter(self.counter, "actor")
        self.learner_counter = Counter(self.counter, "learner")
        self.returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self.policy_returns: dict[str, deque[float]] = {}  # games of several policies
        self.last_metrics: dict[str, float] = {}
        self._learned: list[tuple[int, dict[str, Any]]] = []  # since the last learner row
        self.extra: dict[str, float] = {}  # runtime figures for the summary (restarts, queues)
        self._counts_before: dict[str, float] = {}  # extras of the sessions before a resume
        self.callbacks: Callbacks | None = None  # told of every log and checkpoint
        self._lock = threading.Lock()
        self._begin()
        self._progress = None
        if progress:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
            )
            self._task = self._progress.add_task(  # episodes, where they end the run
                f"{meta['agent']} {meta['env']}", total=total_episodes or total_steps, info=""
            )
            self._progress.start()

    @property
    def counters(self) -> dict[str, float]:
        return self.counter.get_counts()

    def _begin(self) -> None:
        now = time.monotonic()
        self._t0 = now
        self._wall0 = self.counters["wall_time_s"]
        self._steps0 = self.counters[self.counts]
        self._first_learn: float | None = None
        self._learn_wall0 = self.counters["learner_walltime"]
        self._last_log = now
        self._last_ckpt = now

    # from the runtimes ---------------------------------------------------------------------
    def add_actor_steps(self, n: int, agent_steps: int = 0) -> None:
        """Count ``n`` environment steps, and in a multi-agent game the ``agent_steps`` its
        agents took (those away are not counted)."""
        self.actor_counter.increment(steps=n)
        if agent_steps:
            self.counter.increment(agent_steps=agent_steps)

    def set_run_count(self, name: str, value: int) -> None:
        """Report a count a runtime keeps from zero in each session (restarts, reconnects): the
        summary shows it added to what earlier sessions of a resumed run counted."""
        self.extra[name] = self._counts_before.get(name, 0) + value

    def open_windows(self, policies: Iterable[str]) -> None:
        """Give each policy of a game of several its final-return window (empty) from the start,
        so that a policy whose first episode has not ended yet is told apart from a name the
        run does not have (``final_return_window_<policy>`` is 0, not missing). A game of one
        policy has none: its returns are the run's (``final_return_mean``)."""
        names = list(dict.fromkeys(policies))
        if len(names) < 2:
            return
        for name in names:
            self.policy_returns.setdefault(name, deque(maxlen=RETURN_WINDOW))

    def episodes(
        self, returns: np.ndarray, lengths: np.ndarray, policies: list[str] | None = None
    ) -> None:
        """Finished episodes, one train.csv row each; in a game of several policies
        (``policies``: each episode's), the return goes to its policy's column and window
        (``episode_return_adversary``, ``final_return_mean_adversary``)."""
        with self._lock:
            steps = int(self.counters["actor_steps"])
            policies = policies or [None] * len(returns)
            for ret, length, policy in zip(returns.tolist(), lengths.tolist(), policies,
                                           strict=True):  # fmt: skip
                self.counter.increment(episodes=1)
                if policy is None:
                    self.returns.append(ret)
                    column = "episode_return"
                else:
                    window = self.policy_returns.setdefault(policy, deque(maxlen=RETURN_WINDOW))
                    window.append(ret)
                    column = f"episode_return_{policy}"
                self.rundir.log(
                    "train",
                    {
                        "actor_steps": steps,
                        column: ret,
                        "episode_length": int(length),
                        "sps": round(self.sps(), 1),
                        "wall_time_s": round(self._wall_time(), 3),
                    },
                    step=steps,
                )

    def episode_means(
        self, count: int, returns: dict[str, float], length_mean: float, **extra: float
    ) -> None:
        """Report ``count`` episodes by their means (the device runtime finishes thousands per
        rollout): one train.csv row, and one entry of the final-return window. ``returns`` is
        the mean return of each policy; a game of several policies (taggers and runners) gets a
        window per policy (``final_return_mean_tagger``, ...), never one of their average."""
        with self._lock:
            steps = int(self.counters["actor_steps"])
            self.counter.increment(episodes=count)
            if len(returns) == 1:
                (value,) = returns.values()
                self.returns.append(value)
                columns = dict(episode_return=value)
            else:
                for name, value in returns.items():
                    window = self.policy_returns.setdefault(name, deque(maxlen=RETURN_WINDOW))
                    window.append(value)
                columns = {f"episode_return_{k}": v for k, v in returns.items()}
            row = dict(actor_steps=steps, episodes=count, **columns, episode_length=length_mean,
                       **extra, sps=round(self.sps(), 1),
                       wall_time_s=round(self._wall_time(), 3))  # fmt: skip
            self.rundir.log("train", row, step=steps)

    def learner(self, metrics: dict[str, Any], steps: int = 1) -> None:
        """Count ``steps`` learner steps, ``metrics`` being their means (numbers or 0-d tensors,
        read only when the next learner row is written, every log interval)."""
        with self._lock:
            now = time.monotonic()
            if self._first_learn is None:
                self._first_learn = now
            self.learner_counter.increment(steps=steps)
            self.learner_counter.set(walltime=self._learn_wall0 + now - self._first_learn)
            self._learned.append((steps, metrics))
            if len(self._learned) >= MAX_UNREAD:  # a log interval longer than memory allows
                self._learned = [(sum(n for n, _ in self._learned), mean_metrics(self._learned))]

    def write_learner_row(self) -> None:
        """One ``learner.csv`` row of the steps since the last row: their mean metrics (see
        :func:`mean_metrics`). A non-finite metric stops the run, after its row is written."""
        with self._lock:
            learned, self._learned = self._learned, []
            if not learned:
                return
            metrics = mean_metrics(learned)
            self.last_metrics = metrics
            counts = self.counters
            row = dict(
                learner_steps=int(counts["learner_steps"]),
                actor_steps=int(counts["actor_steps"]),
                learner_walltime=round(counts["learner_walltime"], 3),
                sps=round(self.sps(), 1),
                **metrics,
            )
            self.rundir.log("learner", row, step=int(counts[self.counts]))
        bad = [f"{k}={v}" for k, v in metrics.items()
               if isinstance(v, int | float) and not math.isfinite(v)]  # fmt: skip
        if bad:
            last = row["learner_steps"]
            first = last - sum(n for n, _ in learned) + 1
            steps = f"step {last}" if first == last else f"steps {first}-{last}"
            raise TrainingDiverged(f"learner {steps}: {', '.join(bad)}; {TrainingDiverged.HINT}")

    # the main loop ---------------------------------------------------------------------------
    def done(self) -> bool:
        """The run's budget is spent: its steps, or its episodes where it has a number of them."""
        counts = self.counters
        episodes_done = 0 < self.total_episodes <= counts["episodes"]
        return counts[self.counts] >= self.total_steps or episodes_done

    def tick(self) -> bool:
        """Log if due; return True when a checkpoint is due."""
        now = time.monotonic()
        if now - self._last_log >= self.log_interval_s:
            self._last_log = now
            self.write_learner_row()
            summary = self.write_summary()
            if self.callbacks is not None:
                self.callbacks.on_log({**summary, **self.last_metrics})
        if now - self._last_ckpt >= self.checkpoint_interval_s:
            self._last_ckpt = now
            return True
        return False

    def checkpointed(self, path: Path, seconds: float) -> None:
        """A checkpoint was just gathered and written to ``path``, in ``seconds``: rewrite the
        summary with it (so summary.json never lags the checkpoint a crash would resume from),
        and space the next one so that checkpoints take at most ``CHECKPOINT_SHARE`` of the run
        (large replay tables), as the latest one took."""
        self.checkpoint_interval_s = max(self.checkpoint_every_s, seconds / CHECKPOINT_SHARE)
        self.write_summary()
        if self.callbacks is not None:
            self.callbacks.on_checkpoint(path)

    def sps(self) -> float:
        elapsed = time.monotonic() - self._t0
        return (self.counters[self.counts] - self._steps0) / elapsed if elapsed > 0 else 0.0

    def _wall_time(self) -> float:
        return self._wall0 + time.monotonic() - self._t0

    def summary(self) -> dict[str, Any]:
        with self._lock:
            self.counter.set(wall_time_s=self._wall_time())
            summary = dict(
                **self.meta,
                **{k: (int(v) if k.endswith(("steps", "episodes")) else v)
                   for k, v in self.counters.items()},
                sps=round(self.sps(), 1),
                final_return_mean=float(np.mean(self.returns)) if self.returns else None,
                final_return_window=len(self.returns),
                **{f"final_return_mean_{k}": float(np.mean(v)) if v else None
                   for k, v in self.policy_returns.items()},
                **{f"final_return_window_{k}": len(v) for k, v in self.policy_returns.items()},
                total_steps=self.total_steps,
                **({"total_episodes": self.total_episodes} if self.total_episodes else {}),
                **self.extra,
            )  # fmt: skip
            summary["wall_time_s"] = round(summary["wall_time_s"], 2)
        return summary

    def write_summary(self) -> dict[str, Any]:
        summary = self.summary()
        self.rundir.write_summary(summary)
        self.rundir.flush()
        if self._progress is not None:
            ret = summary["final_return_mean"]
            loss = self.last_metrics.get("total_loss")
            info = f"{summary['sps']:,.0f} steps/s"
            info += f"  return {ret:.1f}" if ret is not None else ""
            for name in self.policy_returns:
                value = summary[f"final_return_mean_{name}"]
                info += f"  {name} {value:.2f}" if value is not None else ""
            info += f"  loss {loss:.3f}" if loss is not None else ""
            done = summary["episodes"] if self.total_episodes else summary[self.counts]
            self._progress.update(self._task, completed=done, info=info)
        return summary

    def close(self) -> dict[str, Any]:
        with contextlib.suppress(TrainingDiverged):  # ending anyway; the row says what went wrong
            self.write_learner_row()
        summary = self.write_summary()
        if self._progress is not None:
            self._progress.stop()
        self.rundir.close()
        return summary

    # checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            self.counter.set(wall_time_s=self._wall_time())
            return dict(counters=self.counter.state_dict(), returns=list(self.returns),
                        policy_returns={k: list(v) for k, v in self.policy_returns.items()},
                        extra=dict(self.extra))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counter.load_state_dict(state["counters"])
        self.returns.extend(state["returns"])
        for name, values in state["policy_returns"].items():
            self.policy_returns[name] = deque(values, maxlen=RETURN_WINDOW)
        self.extra.update(state["extra"])
        self._counts_before = dict(state["extra"])
        self._begin()
