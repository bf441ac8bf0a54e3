"""PolyBeast's two batching primitives, in Python threads (torch ops release the GIL).

- :class:`DynamicBatcher`: many callers ask for inference; one thread gathers their requests
  into a batch (at least ``min_batch_size`` rows, or whatever came before ``timeout_s``; at most
  ``max_batch_size``), runs the model once on the learner's device and hands each caller its
  slice of the outputs.
- :class:`BatchingQueue`: producers put rollouts; the learner gets exactly ``batch_size`` of them
  at a time, joined along the batch dimension. ``put`` blocks while ``max_queued`` rollouts
  wait, which bounds the policy lag.

Both count what they do (batch sizes, waits, fill levels) in ``stats()``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

import torch

Tensors = dict[str, torch.Tensor]


class Closed(RuntimeError):
    """The batcher or queue was closed while a caller waited on it."""


class _Request:
    __slots__ = ("inputs", "rows", "outputs", "error", "done", "t0")

    def __init__(self, inputs: Tensors):
        self.inputs = inputs
        self.rows = next(iter(inputs.values())).shape[0]
        self.outputs: Tensors | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.t0 = time.monotonic()


class DynamicBatcher:
    """``compute(inputs) -> outputs`` from any thread, batched along dimension 0.

    ``fn(batch_inputs) -> batch_outputs`` runs on one batcher thread with every input
    concatenated; each output must keep the batch dimension first. A caller's rows stay together
    (a request never spans two batches). If ``fn`` raises, every caller in that batch gets the
    exception.
    """

    def __init__(
        self,
        fn: Callable[[Tensors], Tensors],
        min_batch_size: int = 1,
        max_batch_size: int = 1024,
        timeout_s: float = 0.01,
        device: torch.device | str = "cpu",
    ):
        if not 1 <= min_batch_size <= max_batch_size:
            raise ValueError(
                f"need 1 <= min_batch_size <= max_batch_size, got {min_batch_size}, "
                f"{max_batch_size}"
            )
        self.fn, self.device = fn, torch.device(device)
        self.min_batch_size, self.max_batch_size, self.timeout_s = (
            min_batch_size,
            max_batch_size,
            timeout_s,
        )
        self._pending: deque[_Request] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._batches = self._rows = 0
        self._wait_s = 0.0
        self._thread = threading.Thread(target=self._loop, name="dynamic-batcher", daemon=True)
        self._thread.start()

    def compute(self, inputs: Tensors) -> Tensors:
        request = _Request(inputs)
        if request.rows > self.max_batch_size:
            raise ValueError(
                f"a request of {request.rows} rows exceeds max_batch_size={self.max_batch_size}"
            )
        with self._cond:
            if self._closed:
                raise Closed("the batcher is closed")
            self._pending.append(request)
            self._cond.notify()
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.outputs

    def _take_batch(self) -> list[_Request] | None:
        """Wait for requests; return those of the next batch (None once closed)."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            deadline = self._pending[0].t0 + self.timeout_s
            while sum(r.rows for r in self._pending) < self.min_batch_size and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, rows = [], 0
            while self._pending and rows + self._pending[0].rows <= self.max_batch_size:
                request = self._pending.popleft()
                batch.append(request)
                rows += request.rows
            return batch

    def _loop(self) -> None:
        while (batch := self._take_batch()) is not None:
            now = time.monotonic()
            try:
                inputs = {
                    k: torch.cat([r.inputs[k] for r in batch]).to(self.device, non_blocking=True)
                    for k in batch[0].inputs
                }
                outputs = self.fn(inputs)
                start = 0
                for r in batch:
                    r.outputs = {k: v[start : start + r.rows] for k, v in outputs.items()}
                    start += r.rows
            except BaseException as e:  # every caller hears about it; the batcher goes on
                for r in batch:
                    r.error = e
            self._batches += 1
            self._rows += sum(r.rows for r in batch)
            self._wait_s += sum(now - r.t0 for r in batch)
            for r in batch:
                r.done.set()
        with self._cond:  # closed: fail whoever still waits
            for r in self._pending:
                r.error = Closed("the batcher is closed")
                r.done.set()
            self._pending.clear()

    def stats(self) -> dict[str, float]:
        """Batches run, mean rows per batch and mean wait of a request before its batch ran."""
        return dict(
            inference_batches=self._batches,
            inference_batch_size=self._rows / self._batches if self._batches else 0.0,
            inference_wait_ms=1000 * self._wait_s / self._rows if self._rows else 0.0,
        )

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)


class BatchingQueue:
    """Assembles ``batch_size`` items (dicts of tensors plus anything picklable alongside) for
    the learner; ``put`` blocks while ``max_queued`` items wait (back-pressure).

    ``get`` returns ``(joined, extras)``: each tensor field concatenated along ``dim`` (1 for
    ``[T + 1, B]`` rollouts, so ``batch_size`` rollouts of ``K`` environments make ``B = K *
    batch_size``), and the list of the items' extras in the same order.
    """

    def __init__(self, batch_size: int, max_queued: int | None = None, dim: int = 1):
        max_queued = max_queued or 2 * batch_size
        if batch_size < 1 or max_queued < batch_size:
            raise ValueError(
                f"need batch_size >= 1 and max_queued >= batch_size, got {batch_size}, {max_queued}"
            )
        self.batch_size, self.max_queued, self.dim = batch_size, max_queued, dim
        self._items: deque = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._gets = 0
        self._fill_sum = 0
        self._put_wait_s = 0.0

    def put(self, item: Tensors, extra=None, timeout: float | None = None) -> bool:
        """Queue ``item``; blocks while the queue is full. False if ``timeout`` ran out."""
        t0 = time.monotonic()
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self._closed or len(self._items) < self.max_queued, timeout
            )
            if self._closed:
                raise Closed("the queue is closed")
            if not ok:
                return False
            self._items.append((item, extra))
            self._put_wait_s += time.monotonic() - t0
            self._cond.notify_all()
            return True

    def get(self, timeout: float | None = None) -> tuple[Tensors, list] | None:
        """The next ``batch_size`` items, stacked; None if ``timeout`` ran out first."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self._closed or len(self._items) >= self.batch_size, timeout
            )
            if self._closed:
                raise Closed("the queue is closed")
            if not ok:
                return None
            self._fill_sum += len(self._items)
            self._gets += 1
            taken = [self._items.popleft() for _ in range(self.batch_size)]
            self._cond.notify_all()
        joined = {k: torch.cat([item[k] for item, _ in taken], self.dim) for k in taken[0][0]}
        return joined, [extra for _, extra in taken]

    def __len__(self) -> int:
        return len(self._items)

    def stats(self) -> dict[str, float]:
        return dict(
            queue_size=len(self._items),
            queue_fill_mean=self._fill_sum / self._gets if self._gets else 0.0,
            queue_put_wait_s=self._put_wait_s,
        )

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
