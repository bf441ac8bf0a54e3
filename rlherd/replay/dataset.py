"""Batches for a learner: samples from a table as tensors on its device, with prefetching."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from rlherd.replay.table import RateLimiterTimeout, SampleBatch, Table

POLL_S = 0.5


@dataclass
class ReplaySample:
    """``data[field] [B, ...]`` on the device, the sample info, and importance weights
    ``(N * P(i)) ** -beta`` normalised by their batch maximum (None when ``beta`` is None)."""

    data: dict[str, torch.Tensor]
    info: SampleBatch  # keys, probabilities, table_size, priorities (numpy); data left empty
    weights: torch.Tensor | None


def importance_weights(probabilities: np.ndarray, table_size: np.ndarray, beta: float):
    """Prioritised replay's correction (Schaul et al. 2016, section 3.4)."""
    w = (table_size * probabilities) ** (-beta)
    return w / w.max()


class ReplayDataset:
    """An iterator of :class:`ReplaySample` from ``table``.

    ``prefetch=0`` samples when ``next()`` is called (what a single process that acts and learns
    needs: it learns only while :meth:`ready` says the limiter allows a batch). ``prefetch=k``
    keeps up to ``k`` batches sampled ahead by a background thread (close() stops it).
    ``importance_beta`` is a number or a function of nothing, read at every batch (a schedule).
    """

    def __init__(
        self,
        table: Table,
        batch_size: int,
        device: str | torch.device = "cpu",
        prefetch: int = 0,
        importance_beta: float | Callable[[], float] | None = None,
        timeout: float | None = None,
    ):
        self.table, self.batch_size, self.device = table, batch_size, torch.device(device)
        self.importance_beta, self.timeout = importance_beta, timeout
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()
        if prefetch > 0:
            self._queue = queue.Queue(maxsize=prefetch)
            self._thread = threading.Thread(target=self._prefetch, daemon=True, name="prefetch")
            self._thread.start()

    def ready(self) -> bool:
        """True if ``next()`` would not block."""
        if self._queue is not None:
            return not self._queue.empty()
        return self.table.can_sample(self.batch_size)

    def _make(self, sample: SampleBatch) -> ReplaySample:
        non_blocking = self.device.type == "cuda"
        data = {
            k: torch.as_tensor(v).to(self.device, non_blocking=non_blocking)
            for k, v in sample.data.items()
        }
        weights = None
        if self.importance_beta is not None:
            beta = self.importance_beta
            beta = beta() if callable(beta) else beta
            w = importance_weights(sample.probabilities, sample.table_size, beta)
            weights = torch.as_tensor(w, dtype=torch.float32, device=self.device)
        sample.data = {}
        return ReplaySample(data, sample, weights)

    def _prefetch(self) -> None:
        while not self._stop.is_set():
            try:
                sample = self.table.sample(self.batch_size, timeout=POLL_S)
            except RateLimiterTimeout:
                continue
            item = self._make(sample)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=POLL_S)
                    break
                except queue.Full:
                    continue

    def __iter__(self) -> ReplayDataset:
        return self

    def __next__(self) -> ReplaySample:
        if self._queue is None:
            return self._make(self.table.sample(self.batch_size, timeout=self.timeout))
        try:
            return self._queue.get(timeout=self.timeout)
        except queue.Empty:
            raise RateLimiterTimeout(
                f"no batch from table {self.table.name!r} within {self.timeout}s"
            ) from None

    def close(self) -> None:
        self._stop.set()
        if self._queue is not None:
            self._thread.join(timeout=5)
