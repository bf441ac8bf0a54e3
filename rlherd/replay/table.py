"""A replay table (Reverb's role, in process): preallocated storage, selectors, rate limiting.

Items are dicts of arrays that match the table's *signature* (field -> shape, dtype); they are
copied into storage preallocated per field, so the hot path creates no per-item Python objects.
A table that holds frames (``compress=True``) keeps each item's frames zlib-compressed instead
(:class:`ZlibColumn`), as Reverb compresses what it stores.
An item's key is ``insert_count * max_size + slot``: keys increase with insertion order and give
the storage slot back with one modulo, so priority updates need no lookup table.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlherd.errors import ConfigError
from rlherd.replay.rate_limiters import MinSize, Queue, RateLimiter
from rlherd.replay.selectors import Fifo, Lifo, Selector

Signature = dict[str, tuple[tuple[int, ...], Any]]

# A field is compressed where it holds frames: bytes of at least this many per item (one 84x84
# grayscale frame is 7,056). Smaller fields (MinAtar's grids, MiniGrid's views, vectors) would
# cost the compressor's time per item and save little.
FRAME_BYTES = 4096
# A table of compressed items measures what they take once it holds this many, and stops a run
# whose replay would not fit then, rather than when it fills, hours later. (A resumed run was
# measured when it began.)
FIT_CHECK_AT = 1000
# What Python holds for each compressed field of an item beyond its bytes: the bytes object's
# header (33) and the allocator's rounding; tracemalloc measured 85 over 20,000 Atari items.
OBJECT_BYTES = 96


def machine_memory() -> int:
    """Bytes of physical memory this machine has."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _check_fits(name: str, max_size: int, item_nbytes: int, measured: str = "") -> None:
    """Storage is preallocated, lazily: a table larger than the machine's memory fails at once
    or once it fills (Atari's 1M stacked frames, twice over with the next observations, are 53
    GiB as arrays). Say so before a run starts, with a size that fits; for compressed items,
    whose size is known only once some are in, as soon as it is (``measured`` says how). A
    table within the machine's memory goes ahead even where other processes hold much of it
    now, as it fills slowly."""
    need, have = max_size * item_nbytes, machine_memory()
    if need > have:
        fits = max(1, int(0.5 * have) // item_nbytes)
        raise ConfigError(
            f"replay table {name!r}: {max_size:,} items of {item_nbytes:,} bytes{measured} need "
            f"{need / 2**30:.1f} GiB, more than this machine's {have / 2**30:.1f} GiB of memory; "
            f"{fits:,} items take about half of it (a replay agent's replay_size: --set "
            f"replay_size={fits})"
        )


def compressible(signature: Signature) -> list[str]:
    """The fields of ``signature`` that hold frames: ``uint8`` and at least ``FRAME_BYTES`` per
    item (stacked Atari frames, pixels)."""
    return [k for k, (shape, dtype) in signature.items()
            if np.dtype(dtype) == np.uint8 and int(np.prod(shape)) >= FRAME_BYTES]  # fmt: skip


class ZlibColumn:
    """One field's items, each zlib-compressed (level 1) in a slot of its own.

    Why: DQN's replay of a million Atari transitions holds two stacks of four 84x84 frames per
    item, 53 GiB as arrays. Frames are mostly background, and zlib's fastest level shrinks a
    stack 10x (Ms. Pac-Man) to 50x (Pong) in about 0.1 ms, and gives it back in 0.05 ms, so the
    million fit in 1-6 GiB for a small share of a step's time. (Reverb, Acme's replay, compresses
    its chunks with zstd the same way; zlib is Python's own.) :meth:`unpack` returns a new
    array, as the fancy indexing of a plain column does."""

    def __init__(self, max_size: int, shape: tuple[int, ...], dtype: np.dtype):
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.items: list[bytes] = [b""] * max_size
        self.nbytes = 0  # compressed bytes held

    def pack(self, value: np.ndarray) -> bytes:
        """One item compressed: what an insert does before it takes the table's lock."""
        return zlib.compress(np.ascontiguousarray(value, dtype=self.dtype).tobytes(), 1)

    def put(self, slot: int, data: bytes) -> None:
        self.nbytes += len(data) - len(self.items[slot])
        self.items[slot] = data

    def take(self, slots: np.ndarray) -> np.ndarray:
        """The items' compressed bytes (an object array): what a sample reads under the table's
        lock, to :meth:`unpack` once it is released, so that inserts need not wait for it."""
        out = np.empty(len(slots), dtype=object)
        out[:] = [self.items[s] for s in slots.tolist()]
        return out

    def unpack(self, items: np.ndarray) -> np.ndarray:
        """:meth:`take`'s bytes as an array of the field's shape and dtype."""
        out = np.empty((len(items), *self.shape), dtype=self.dtype)
        for row, data in zip(out.reshape(len(items), -1), items, strict=True):
            row[:] = np.frombuffer(zlib.decompress(data), dtype=self.dtype)
        return out

    def drop(self, slot: int) -> None:
        """Let go of a removed item's bytes."""
        self.nbytes -= len(self.items[slot])
        self.items[slot] = b""

    def state(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """The items at ``slots`` still compressed, as two arrays: their bytes end to end and
        each one's length (a checkpoint of a million items stays the size it is here)."""
        items = [self.items[s] for s in slots.tolist()]
        data = np.frombuffer(b"".join(items), dtype=np.uint8)
        return dict(zdata=data, zsize=np.array([len(b) for b in items], dtype=np.int64))

    def load(self, slots: np.ndarray, data: np.ndarray, sizes: np.ndarray) -> None:
        ends = np.cumsum(sizes, dtype=np.int64)
        starts = (ends - sizes).tolist()
        raw = np.asarray(data, dtype=np.uint8).tobytes()
        for slot, start, end in zip(slots.tolist(), starts, ends.tolist(), strict=True):
            self.nbytes += (end - start) - len(self.items[slot])
            self.items[slot] = raw[start:end]


class RateLimiterTimeout(TimeoutError):
    """An insert or sample waited longer than its timeout for the rate limiter."""


@dataclass
class SampleBatch:
    """Sampled items ``data[field] [B, ...]`` and, per item, what a learner needs to correct for
    prioritisation and to update priorities."""

    data: dict[str, np.ndarray]
    keys: np.ndarray  # [B] int64
    probabilities: np.ndarray  # [B] float64, the selector's probability of each sample
    table_size: np.ndarray  # [B] int64, the table's size when each was sampled
    priorities: np.ndarray  # [B] float64
    times_sampled: np.ndarray  # [B] int64, including this sample

    def split(self, size: int) -> list[SampleBatch]:
        """Consecutive batches of ``size`` items (views): a batch of several sampled at once
        (on a replay node, to pay for one call) back into the batches a learner steps on."""
        columns = (self.keys, self.probabilities, self.table_size, self.priorities,
                   self.times_sampled)  # fmt: skip
        return [SampleBatch({k: v[i:i + size] for k, v in self.data.items()},
                            *(c[i:i + size] for c in columns))
                for i in range(0, len(self.keys), size)]  # fmt: skip


class Table:
    """A thread-safe replay table.

    Args:
        name: for messages.
        signature: ``{field: (shape, dtype)}`` of one item.
        max_size: capacity; inserting into a full table first removes the ``remover``'s choice.
        sampler: the selector that picks samples (``Uniform()``, ``Prioritized(0.6)``, ...).
        remover: the selector that picks what to remove when full (default ``Fifo()``).
        max_times_sampled: remove an item after this many samples (0: never).
        rate_limiter: when inserts and samples may proceed (default ``MinSize(1)``).
        seed: for the sampler's random numbers.
        compress: keep the fields that hold frames (:func:`compressible`) zlib-compressed, one
            item at a time (:class:`ZlibColumn`): for replay that holds many items for long.
            A queue, whose items leave soon after they come, gains nothing from it.
    """

    def __init__(
        self,
        name: str,
        signature: Signature,
        max_size: int,
        sampler: Selector,
        remover: Selector | None = None,
        max_times_sampled: int = 0,
        rate_limiter: RateLimiter | None = None,
        seed: int = 0,
        compress: bool = False,
    ):
        if max_size < 1:
            raise ValueError(f"table {name!r}: max_size must be >= 1, got {max_size}")
        if max_times_sampled < 0:
            raise ValueError(f"table {name!r}: max_times_sampled must be >= 0")
        self.name = name
        self.signature = {k: (tuple(shape), np.dtype(dt)) for k, (shape, dt) in signature.items()}
        self.max_size = max_size
        self.sampler = sampler
        self.remover = remover if remover is not None else Fifo()
        if self.remover is sampler:
            raise ValueError(f"table {name!r}: sampler and remover must be separate objects")
        self.max_times_sampled = max_times_sampled
        self.limiter = rate_limiter if rate_limiter is not None else MinSize(1)
        self.rng = np.random.default_rng(seed)
        self.compressed = compressible(self.signature) if compress else []
        nbytes = {k: int(np.prod(shape)) * dt.itemsize for k, (shape, dt) in self.signature.items()}
        self.item_nbytes = sum(nbytes.values())  # as arrays: what a sample of one takes
        # What an item takes here before its compressed fields, known once some are in
        # (FIT_CHECK_AT): the fields stored as arrays, and a compressed one's slot in its list.
        self.array_nbytes = sum(8 if k in self.compressed else n for k, n in nbytes.items())
        _check_fits(name, max_size, self.array_nbytes)
        self.storage: dict[str, np.ndarray | ZlibColumn] = {
            k: np.zeros((max_size, *shape), dtype=dt) for k, (shape, dt) in self.signature.items()
            if k not in self.compressed
        }  # and the compressed columns, made by _clear
        self._cond = threading.Condition(threading.Lock())
        self._clear()

    @classmethod
    def queue(cls, name: str, signature: Signature, max_size: int) -> Table:
        """A FIFO queue: each item is sampled once, inserts block while it is full."""
        return cls(name, signature, max_size, Fifo(), Fifo(), 1, Queue(max_size))

    @classmethod
    def stack(cls, name: str, signature: Signature, max_size: int) -> Table:
        """A LIFO stack: each item is sampled once, inserts block while it is full."""
        return cls(name, signature, max_size, Lifo(), Lifo(), 1, Queue(max_size))

    def _clear(self) -> None:
        self.keys = np.full(self.max_size, -1, dtype=np.int64)  # -1: free slot
        self.priorities = np.zeros(self.max_size, dtype=np.float64)
        self.times_sampled = np.zeros(self.max_size, dtype=np.int64)
        self.free_slots = list(range(self.max_size - 1, -1, -1))
        self.insert_count = 0
        for k in self.compressed:  # plain columns' old rows are never read again
            self.storage[k] = ZlibColumn(self.max_size, *self.signature[k])
        self.sampler.reset(self.max_size)
        self.remover.reset(self.max_size)

    # ------------------------------------------------------------------------------ reading
    @property
    def size(self) -> int:
        return self.max_size - len(self.free_slots)

    def can_sample(self, n: int = 1) -> bool:
        with self._cond:
            return self.limiter.can_sample(n)

    def can_insert(self, n: int = 1) -> bool:
        with self._cond:
            return self.limiter.can_insert(n)

    def inserts_allowed(self, most: int) -> int:
        with self._cond:
            return self.limiter.inserts_allowed(most)

    def wait_until_can_sample(self, n: int, timeout: float | None = None) -> bool:
        """Wait until ``n`` samples may proceed at once; False after ``timeout``. A sampler of a
        table that removes what it samples (a queue) waits here first, so that a sample which
        times out half-way never drops the items it already took."""
        with self._cond:
            return self._cond.wait_for(lambda: self.limiter.can_sample(n), timeout)

    def info(self) -> dict[str, Any]:
        with self._cond:
            return dict(
                name=self.name,
                size=self.size,
                max_size=self.max_size,
                sampler=repr(self.sampler),
                remover=repr(self.remover),
                rate_limiter=repr(self.limiter),
                **self.limiter.state_dict(),
            )

    # ------------------------------------------------------------------------------ writing
    def _check(self, item: dict[str, Any]) -> dict[str, np.ndarray]:
        missing = set(self.signature) - set(item)
        extra = set(item) - set(self.signature)
        if missing or extra:
            raise ValueError(
                f"table {self.name!r}: item fields do not match the signature "
                f"(missing {sorted(missing)}, unexpected {sorted(extra)})"
            )
        out = {}
        for k, (shape, dtype) in self.signature.items():
            value = np.asarray(item[k])
            if value.shape != shape:
                raise ValueError(
                    f"table {self.name!r}: field {k!r} has shape {value.shape}, expected {shape}"
                )
            if value.dtype != dtype and not np.can_cast(value.dtype, dtype, "same_kind"):
                raise TypeError(
                    f"table {self.name!r}: field {k!r} has dtype {value.dtype}, expected {dtype}"
                )
            out[k] = value
        return out

    def _wait(self, ready, timeout: float | None, what: str) -> None:
        if ready():
            return
        if not self._cond.wait_for(ready, timeout):
            raise RateLimiterTimeout(
                f"table {self.name!r}: {what} waited {timeout:.3g}s for the rate limiter "
                f"{self.limiter!r} (size {self.size}, {self.limiter.state_dict()}). Inserts wait "
                "for samples and samples for inserts: is the other side running?"
            )

    def _delete(self, slot: int) -> None:
        self.sampler.delete(slot)
        self.remover.delete(slot)
        self.keys[slot] = -1
        for k in self.compressed:
            self.storage[k].drop(slot)
        self.free_slots.append(slot)
        self.limiter.deletes += 1

    def insert(self, item: dict[str, Any], priority: float = 1.0, timeout: float | None = None):
        """Insert one item (blocking as the rate limiter says); return its key."""
        values = self._check(item)
        for k in self.compressed:  # before the lock, which samples and other inserts wait on
            values[k] = self.storage[k].pack(values[k])
        with self._cond:
            self._wait(lambda: self.limiter.can_insert(1), timeout, "insert")
            key = self._put(values, priority)
            self._cond.notify_all()
        return key

    def insert_many(self, columns: dict[str, np.ndarray], priorities: np.ndarray,
                    timeout: float | None = None) -> int:  # fmt: skip
        """Insert the rows of ``columns`` (each field with a leading axis of rows) in order, each
        as the rate limiter allows; return how many went in before ``timeout``.

        What an actor's chunk costs on a replay node: the fields are checked once, and the lock
        taken once for every row the limiter lets in without waiting, where ``insert`` pays
        both per row."""
        priorities = np.asarray(priorities, dtype=np.float64)
        n = len(priorities)
        if not n:
            return 0
        self._check({k: v[0] for k, v in columns.items()})  # the fields, by their first row
        values = {k: np.asarray(columns[k]) for k in self.signature}
        if any(len(v) != n for v in values.values()):
            raise ValueError(f"table {self.name!r}: columns of {n} rows expected, got "
                             f"{ {k: len(v) for k, v in values.items()} }")  # fmt: skip
        for k in self.compressed:  # before the lock, as insert does
            values[k] = [self.storage[k].pack(row) for row in values[k]]
        deadline = None if timeout is None else time.monotonic() + timeout
        done = 0
        with self._cond:
            while done < n:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    self._wait(lambda: self.limiter.can_insert(1), left, "insert")
                except RateLimiterTimeout:
                    break
                while done < n and self.limiter.can_insert(1):
                    self._put({k: v[done] for k, v in values.items()}, float(priorities[done]))
                    done += 1
                self._cond.notify_all()
        return done

    def _put(self, values: dict[str, Any], priority: float) -> int:
        """Write one item into a slot (freeing one by the remover when the table is full) and
        return its key; the lock is held."""
        if self.compressed and self.insert_count == FIT_CHECK_AT < self.max_size and self.size:
            _check_fits(self.name, self.max_size, self.stored_item_nbytes(),
                        f" (the mean of the {self.size:,} it holds, compressed)")
        if not self.free_slots:
            self._delete(int(self.remover.sample(1, self.rng)[0][0]))
        slot = self.free_slots.pop()
        key = self.insert_count * self.max_size + slot
        self.insert_count += 1
        for k, v in values.items():
            if k in self.compressed:
                self.storage[k].put(slot, v)  # packed by the caller
            else:
                self.storage[k][slot] = v
        self.keys[slot] = key
        self.priorities[slot] = priority
        self.times_sampled[slot] = 0
        self.sampler.insert(slot, key, priority)
        self.remover.insert(slot, key, priority)
        self.limiter.inserts += 1
        return key

    def stored_item_nbytes(self) -> int:
        """What an item takes in this table's memory, on average over those it holds now (all
        of them as arrays where nothing is compressed)."""
        if not self.compressed:
            return self.item_nbytes
        compressed = sum(self.storage[k].nbytes for k in self.compressed)
        per_item = OBJECT_BYTES * len(self.compressed) + compressed // max(1, self.size)
        return self.array_nbytes + per_item

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Set new priorities; keys of items no longer in the table are ignored, and so is -1
        (an item of a batch that came from elsewhere, such as a demonstration)."""
        keys = np.asarray(keys, dtype=np.int64)
        priorities = np.asarray(priorities, dtype=np.float64)
        if keys.shape != priorities.shape:
            raise ValueError(f"{keys.shape[0]} keys but priorities of shape {priorities.shape}")
        if (priorities < 0).any() or not np.isfinite(priorities).all():
            raise ValueError("priorities must be finite and >= 0")
        with self._cond:
            slots = keys % self.max_size
            live = (keys >= 0) & (self.keys[slots] == keys)  # a free slot's key is -1 too
            slots, priorities = slots[live], priorities[live]
            # A key may repeat within a batch (sampling with replacement): the last one wins.
            slots, last = np.unique(slots[::-1], return_index=True)
            priorities = priorities[::-1][last]
            self.priorities[slots] = priorities
            for selector in (self.sampler, self.remover):
                if selector.uses_priority:
                    selector.update(slots, priorities)

    # ------------------------------------------------------------------------------ sampling
    def _columns(self, slots: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, ...]:
        """Copies (fancy indexing) of everything a sample returns, in SampleBatch order; of a
        compressed field, its items' bytes (``sample`` unpacks them after the lock)."""
        size = np.full(len(slots), self.size, dtype=np.int64)
        data = (self.storage[k].take(slots) if k in self.compressed else self.storage[k][slots]
                for k in self.signature)  # fmt: skip
        return (self.keys[slots], probs, size, self.priorities[slots], self.times_sampled[slots],
                *data)  # fmt: skip

    def _take(self, n: int) -> tuple[np.ndarray, ...]:
        """Sample ``n`` items now (the limiter allows it); copy them out before any removal."""
        if self.sampler.deterministic or self.max_times_sampled:
            picks = [self._take_one() for _ in range(n)]
            return tuple(np.concatenate(parts) for parts in zip(*picks, strict=True))
        slots, probs = self.sampler.sample(n, self.rng)
        np.add.at(self.times_sampled, slots, 1)
        self.limiter.samples += n
        return self._columns(slots, probs)

    def _take_one(self) -> tuple[np.ndarray, ...]:
        slots, probs = self.sampler.sample(1, self.rng)
        self.times_sampled[slots] += 1
        self.limiter.samples += 1
        out = self._columns(slots, probs)
        if self.max_times_sampled and self.times_sampled[slots[0]] >= self.max_times_sampled:
            self._delete(int(slots[0]))
        return out

    def sample(self, batch_size: int, timeout: float | None = None,
               batches: int = 1) -> SampleBatch:  # fmt: skip
        """Sample ``batch_size`` items, waiting for the rate limiter (up to ``timeout`` s).

        ``batches`` > 1: then, without waiting, up to ``batches - 1`` more batches of
        ``batch_size``, as many as the limiter allows, in the same batch (``split`` parts them):
        what a replay node sends a learner in one reply. A table that removes what it samples
        gives one batch."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        parts: list[tuple[np.ndarray, ...]] = []
        got = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while got < batch_size:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                self._wait(lambda: self.limiter.can_sample(1), left, "sample")
                n = min(batch_size - got, self.limiter.samples_allowed())
                parts.append(self._take(n))
                got += n
                self._cond.notify_all()
            more = 0 if self.max_times_sampled else batches - 1
            more = min(more, self.limiter.samples_allowed() // batch_size)
            if more:
                parts.append(self._take(more * batch_size))
                self._cond.notify_all()
        cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
        data = dict(zip(self.signature, cols[5:], strict=True))
        for k in self.compressed:
            data[k] = self.storage[k].unpack(data[k])
        return SampleBatch(data, *cols[:5])

    # ------------------------------------------------------------------------------ checkpoints
    def state_dict(self, items: bool = True) -> dict[str, np.ndarray]:
        """The items (in insertion order), their priorities and counts, the limiter's counters
        and the RNG: enough to continue exactly. ``items=False`` leaves out the items' fields
        (``data/...``), for a table whose items can be inserted again (an offline dataset)."""
        with self._cond:
            slots = np.flatnonzero(self.keys >= 0)
            slots = slots[np.argsort(self.keys[slots])]
            state = self._items_state(slots) if items else {}
            state.update(
                keys=self.keys[slots],
                priorities=self.priorities[slots],
                times_sampled=self.times_sampled[slots],
                insert_count=np.array(self.insert_count),
                limiter=np.array(
                    [self.limiter.inserts, self.limiter.samples, self.limiter.deletes]
                ),
                max_size=np.array(self.max_size),
                **{f"sampler/{k}": v for k, v in self.sampler.state_dict().items()},
                **{f"remover/{k}": v for k, v in self.remover.state_dict().items()},
                rng=np.frombuffer(json.dumps(self.rng.bit_generator.state).encode(), np.uint8),
            )
            return state

    def _items_state(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """The items at ``slots``: ``data/FIELD``, or, compressed, ``zdata/FIELD`` and
        ``zsize/FIELD`` (:meth:`ZlibColumn.state`)."""
        state = {}
        for k, column in self.storage.items():
            if k in self.compressed:
                state.update({f"{part}/{k}": v for part, v in column.state(slots).items()})
            else:
                state[f"data/{k}"] = column[slots]
        return state

    def _load_items(self, slots: np.ndarray, state: dict[str, np.ndarray]) -> None:
        """:meth:`_items_state`'s items back into ``slots``."""
        for k, column in self.storage.items():
            if k in self.compressed and f"zdata/{k}" in state:
                column.load(slots, state[f"zdata/{k}"], state[f"zsize/{k}"])
            elif k in self.compressed:  # a checkpoint from before frames compressed
                for slot, value in zip(slots.tolist(), state[f"data/{k}"], strict=True):
                    column.put(slot, column.pack(value))
            else:
                column[slots] = state[f"data/{k}"]

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        if int(state["max_size"]) != self.max_size:
            raise ValueError(
                f"table {self.name!r}: checkpoint has max_size {int(state['max_size'])}, "
                f"this table {self.max_size}"
            )
        with self._cond:
            self._clear()
            keys = np.asarray(state["keys"], dtype=np.int64)
            slots = keys % self.max_size
            self._load_items(slots, state)
            self.keys[slots] = keys
            self.priorities[slots] = state["priorities"]
            self.times_sampled[slots] = state["times_sampled"]
            taken = set(slots.tolist())
            self.free_slots = [s for s in range(self.max_size - 1, -1, -1) if s not in taken]
            rows = zip(slots.tolist(), keys.tolist(), self.priorities[slots].tolist(), strict=True)
            for slot, key, priority in rows:
                self.sampler.insert(slot, key, priority)
                self.remover.insert(slot, key, priority)
            for prefix, selector in (("sampler/", self.sampler), ("remover/", self.remover)):
                n = len(prefix)
                selector.load_state_dict({k[n:]: v for k, v in state.items() if k[:n] == prefix})
            self.insert_count = int(state["insert_count"])
            inserts, samples, deletes = (int(x) for x in state["limiter"])
            self.limiter.load_state_dict(dict(inserts=inserts, samples=samples, deletes=deletes))
            self.rng.bit_generator.state = json.loads(bytes(state["rng"]).decode())
            self._cond.notify_all()

    def save(self, path: str | os.PathLike) -> None:
        """Write the table to ``path`` (.npz) atomically: a crash leaves the old file whole."""
        path = Path(path)
        buffer = io.BytesIO()
        np.savez(buffer, **self.state_dict())
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            f.write(buffer.getvalue())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def restore(self, path: str | os.PathLike) -> None:
        with np.load(path) as data:
            self.load_state_dict(dict(data))
