"""A hierarchical, thread-safe step counter (Acme's ``Counter``).

Counts live in the root; a child counter adds its prefix, so ``Counter(root, "actor")
.increment(steps=5)`` adds 5 to the root's ``actor_steps``. The root is checkpointed with the run.
"""

from __future__ import annotations

import abc
import threading
import time

import numpy as np


class Counter:
    def __init__(self, parent: Counter | None = None, prefix: str = ""):
        self.parent, self.prefix = parent, prefix
        self._counts: dict[str, float] = {}
        self._lock = threading.Lock()

    def _key(self, key: str) -> str:
        return f"{self.prefix}_{key}" if self.prefix else key

    def increment(self, **counts: float) -> dict[str, float]:
        named = {self._key(k): v for k, v in counts.items()}
        if self.parent is not None:
            return self.parent.increment(**named)
        with self._lock:
            for k, v in named.items():
                self._counts[k] = self._counts.get(k, 0) + v
            return dict(self._counts)

    def set(self, **values: float) -> None:
        named = {self._key(k): v for k, v in values.items()}
        if self.parent is not None:
            self.parent.set(**named)
            return
        with self._lock:
            self._counts.update(named)

    def get_counts(self) -> dict[str, float]:
        if self.parent is not None:
            return self.parent.get_counts()
        with self._lock:
            return dict(self._counts)

    def state_dict(self) -> dict[str, float]:
        return self.get_counts()

    def load_state_dict(self, state: dict[str, float]) -> None:
        with self._lock:
            self._counts = dict(state)


class EpisodeTracker:
    """Running returns and lengths of a batch of environments under next-step autoreset: the one
    place rlherd counts episodes (the environment loop of every host runtime and the device
    runtime use it).

    Works on numpy arrays or torch tensors (on any device: nothing here reads a value back, so a
    device rollout never waits for the host). ``returns`` is ``[E, *reward_shape]``, e.g. one
    return per agent of a multi-agent game; ``lengths`` is ``[E]``.
    """

    def __init__(self, returns, lengths):
        self.returns, self.lengths = returns, lengths
        self.sum_returns = returns.sum(0) * 0  # totals over the ended episodes since take()
        self.sum_lengths = lengths.sum() * 0
        self.count = lengths.sum() * 0

    def step(self, reward, terminated, truncated, resetting):
        """Add one step's ``reward`` (``[E, *reward_shape]``) and return the mask ``[E]`` of
        episodes that ended with it. A ``resetting`` step only began a new episode: it
        counts as step 0 of that episode, with reward 0. Until the next step, ``returns`` and
        ``lengths`` still hold the ended episodes' figures."""
        live = ~resetting
        keep = live.reshape(live.shape + (1,) * (reward.ndim - 1))
        self.returns = (self.returns + reward) * keep
        self.lengths = (self.lengths + 1) * live
        ended = (terminated | truncated) & live
        weight = ended.reshape(keep.shape)
        self.sum_returns = self.sum_returns + (self.returns * weight).sum(0)
        self.sum_lengths = self.sum_lengths + (self.lengths * ended).sum()
        self.count = self.count + ended.sum()
        return ended

    def take(self) -> tuple[int, object, float]:
        """``(episodes, mean return [*reward_shape], mean length)`` of the episodes ended since
        the last call (one read from the device), or ``(0, None, 0.0)``."""
        count = int(self.count)
        if count == 0:
            return 0, None, 0.0
        means = self.sum_returns / count, float(self.sum_lengths) / count
        self.sum_returns, self.sum_lengths, self.count = (
            self.sum_returns * 0, self.sum_lengths * 0, self.count * 0,
        )  # fmt: skip
        return count, *means

    def state_dict(self) -> dict:
        keys = ("returns", "lengths", "sum_returns", "sum_lengths", "count")
        return {k: getattr(self, k) for k in keys}

    def load_state_dict(self, state: dict) -> None:
        """Restore, onto the device the tracker lives on (checkpoints load on the CPU)."""
        for k, v in state.items():
            current = getattr(self, k)
            on_device = hasattr(v, "to") and hasattr(current, "to")
            setattr(self, k, v.to(current.device) if on_device else v)


class StepReport(abc.ABC):
    """The environment loop's recorder in an actor that lives away from the run's recorder
    (a ``mono`` process, a ``distributed`` node): steps and finished episodes are gathered and
    sent (``send(steps, agent_steps, episodes)``, a subclass's) at most every ``period_s``.
    ``agent_steps`` are a multi-agent game's (see ``Recorder.add_actor_steps``); ``episodes`` is
    ``(returns, lengths, policies)``: lists, ``policies`` None unless the actor acts for
    several (see ``Recorder.episodes``)."""

    def __init__(self, period_s: float = 0.2):
        self.period_s = period_s
        self.steps, self.agent_steps, self.returns, self.lengths, self.policies = 0, 0, [], [], []
        self.last = time.monotonic()

    def add_actor_steps(self, n: int, agent_steps: int = 0) -> None:
        self.steps += n
        self.agent_steps += agent_steps

    def episodes(
        self, returns: np.ndarray, lengths: np.ndarray, policies: list[str] | None = None
    ) -> None:
        self.returns += returns.tolist()
        self.lengths += lengths.tolist()
        self.policies += policies or [None] * len(returns)

    def report(self, force: bool = False) -> None:
        if self.steps and (force or time.monotonic() - self.last >= self.period_s):
            several = any(p is not None for p in self.policies)
            self.send(self.steps, self.agent_steps,
                      (self.returns, self.lengths, self.policies if several else None))
            self.steps, self.agent_steps, self.returns, self.lengths, self.policies = (
                0, 0, [], [], [])  # fmt: skip
            self.last = time.monotonic()

    @abc.abstractmethod
    def send(self, steps: int, agent_steps: int, episodes: tuple[list, list, list | None]) -> None:
        """Deliver the counts gathered since the last report (a pipe, a counter node)."""
