"""Rate limiters: when a table lets an insert or a sample proceed, with Reverb's arithmetic.

A limiter counts ``inserts``, ``samples`` and ``deletes`` of its table. With
``size = inserts - deletes`` and ``error = inserts * samples_per_insert - samples``:

- ``n`` inserts may proceed if ``size + n <= min_size_to_sample`` (filling up is free), or else if
  ``(inserts + n) * samples_per_insert - samples <= max_diff``;
- ``n`` samples may proceed if ``size >= min_size_to_sample`` and
  ``inserts * samples_per_insert - samples - n >= min_diff``.
"""

from __future__ import annotations

import math
import sys
from typing import Any

_MAX = sys.float_info.max


class RateLimiter:
    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        min_diff: float,
        max_diff: float,
    ):
        if min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample ({min_size_to_sample}) must be >= 1")
        if samples_per_insert <= 0:
            raise ValueError(f"samples_per_insert ({samples_per_insert}) must be > 0")
        if min_diff > max_diff:
            raise ValueError(f"min_diff ({min_diff}) must be <= max_diff ({max_diff})")
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = int(min_size_to_sample)
        self.min_diff = float(min_diff)
        self.max_diff = float(max_diff)
        self.inserts = self.samples = self.deletes = 0

    def can_insert(self, n: int = 1) -> bool:
        if self.inserts + n - self.deletes <= self.min_size_to_sample:
            return True
        return (self.inserts + n) * self.samples_per_insert - self.samples <= self.max_diff

    def can_sample(self, n: int = 1) -> bool:
        if self.inserts - self.deletes < self.min_size_to_sample:
            return False
        return self.inserts * self.samples_per_insert - self.samples - n >= self.min_diff

    def samples_allowed(self) -> int:
        """How many samples may proceed right now (the largest ``n`` with ``can_sample(n)``)."""
        if self.inserts - self.deletes < self.min_size_to_sample:
            return 0
        room = self.inserts * self.samples_per_insert - self.samples - self.min_diff
        return max(0, math.floor(room)) if room < 2**62 else 2**62

    def inserts_allowed(self, most: int) -> int:
        """How many inserts may proceed right now, up to ``most`` (the largest ``n`` with
        ``can_insert(n)``: it only gets harder as ``n`` grows, so a bisection finds it)."""
        lo, hi = 0, most
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.can_insert(mid) else (lo, mid - 1)
        return lo

    def without_insert_blocking(self) -> RateLimiter:
        """The same limiter, but inserts never block: what one process that both acts and learns
        needs (it learns whenever sampling is allowed, as Acme's local layout does)."""
        return RateLimiter(self.samples_per_insert, self.min_size_to_sample, self.min_diff, _MAX)

    def state_dict(self) -> dict[str, Any]:
        return dict(inserts=self.inserts, samples=self.samples, deletes=self.deletes)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inserts = int(state["inserts"])
        self.samples = int(state["samples"])
        self.deletes = int(state["deletes"])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(samples_per_insert={self.samples_per_insert}, "
            f"min_size_to_sample={self.min_size_to_sample}, min_diff={self.min_diff}, "
            f"max_diff={self.max_diff})"
        )


class MinSize(RateLimiter):
    """Samples wait until the table holds ``min_size_to_sample`` items; nothing else blocks."""

    def __init__(self, min_size_to_sample: int):
        super().__init__(1.0, min_size_to_sample, -_MAX, _MAX)


class SampleToInsertRatio(RateLimiter):
    """Keeps ``samples / inserts`` near ``samples_per_insert`` once ``min_size_to_sample`` items
    are in the table.

    ``error_buffer``: a number ``e`` allows ``error`` in ``spi * min_size_to_sample +- e`` (the
    offset means only operations after the table filled up count); a pair ``(lo, hi)`` is used
    as ``(min_diff, max_diff)`` as given.
    """

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        error_buffer: float | tuple[float, float],
    ):
        if isinstance(error_buffer, int | float):
            offset = samples_per_insert * min_size_to_sample
            min_diff, max_diff = offset - error_buffer, offset + error_buffer
        else:
            min_diff, max_diff = error_buffer
        if max_diff - min_diff < 2 * max(1.0, samples_per_insert):
            raise ValueError(
                f"error_buffer gives a range of {max_diff - min_diff}; it must be at least "
                f"2 * max(1, samples_per_insert) = {2 * max(1.0, samples_per_insert)}, or inserts "
                "and samples could block each other for good"
            )
        if min_diff > samples_per_insert * min_size_to_sample:
            raise ValueError(
                "error_buffer's range lies above samples_per_insert * min_size_to_sample: "
                "sampling would deadlock once min_size_to_sample items are in the table"
            )
        super().__init__(samples_per_insert, min_size_to_sample, min_diff, max_diff)


class Bursts(RateLimiter):
    """Stable-Baselines3's schedule: ``samples_per_burst`` samples (a learner's gradient steps
    times its batch size) become allowed each time the inserts reach a multiple of
    ``train_every``, from the first multiple at which the table holds ``min_size_to_sample``
    items. A steady :class:`SampleToInsertRatio` with the same mean ratio interleaves one
    learner step every few inserts instead, which changes what a target network copied every
    so many steps sees.

    Inserts never block in one process (:meth:`without_insert_blocking`); across processes an
    insert that would start a burst waits until the previous one has been sampled.
    """

    def __init__(self, train_every: int, samples_per_burst: int, min_size_to_sample: int,
                 insert_blocking: bool = True):  # fmt: skip
        if train_every < 1 or samples_per_burst < 1:
            raise ValueError(
                f"train_every ({train_every}) and samples_per_burst ({samples_per_burst}) "
                "must be >= 1"
            )
        super().__init__(samples_per_burst / train_every, min_size_to_sample, -_MAX, _MAX)
        self.train_every, self.samples_per_burst = train_every, samples_per_burst
        self.insert_blocking = insert_blocking

    def _allowed(self, inserts: int) -> int:
        """Samples allowed in all once ``inserts`` items were inserted."""
        if inserts < self.min_size_to_sample:
            return 0
        bursts = inserts // self.train_every - (self.min_size_to_sample - 1) // self.train_every
        return self.samples_per_burst * max(0, bursts)

    def can_insert(self, n: int = 1) -> bool:
        if not self.insert_blocking:
            return True
        now = self._allowed(self.inserts)
        previous_burst_sampled = self.samples >= now
        starts_no_burst = self._allowed(self.inserts + n) == now
        return previous_burst_sampled or starts_no_burst

    def can_sample(self, n: int = 1) -> bool:
        return n <= self.samples_allowed()

    def samples_allowed(self) -> int:
        if self.inserts - self.deletes < self.min_size_to_sample:
            return 0
        return max(0, self._allowed(self.inserts) - self.samples)

    def without_insert_blocking(self) -> Bursts:
        return Bursts(self.train_every, self.samples_per_burst, self.min_size_to_sample, False)

    def __repr__(self) -> str:
        return (
            f"Bursts(train_every={self.train_every}, samples_per_burst="
            f"{self.samples_per_burst}, min_size_to_sample={self.min_size_to_sample})"
        )


class Queue(RateLimiter):
    """Turns a table into a queue of ``size`` items (use with Fifo selector and remover and
    ``max_times_sampled=1``; :meth:`rlherd.replay.Table.queue` sets that up)."""

    def __init__(self, size: int):
        super().__init__(1.0, 1, 0.0, float(size))
