"""Replay throughput: inserts/s and sampled items/s of rlherd's tables, next to a plain numpy
ring buffer doing the same work in the same run.

Tables (uniform and prioritized; FIFO removal), batches of 256, CartPole-sized transitions in a
table of capacity 1M, and Atari-sized items (one 4x84x84 uint8 frame stack) in one of 250k: a
1M Atari table needs 26.3 GiB, more than this 24 GiB machine can allocate (``--atari-capacity``
raises it where memory allows). Storage is preallocated once; pages are touched as it fills.

Prints one JSON line per figure. Usage: python benchmarks/replay_throughput.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from rlherd.replay import MinSize, Prioritized, Table, Uniform
from rlherd.run.provenance import machine

CAPACITY = {"cartpole": 1_000_000, "atari": 250_000}
BATCH = 256
ITEMS = {
    "cartpole": {
        "obs": ((4,), np.float32),
        "action": ((), np.int64),
        "reward": ((), np.float32),
        "discount": ((), np.float32),
        "next_obs": ((4,), np.float32),
    },
    "atari": {"obs": ((4, 84, 84), np.uint8), "action": ((), np.int64), "reward": ((), np.float32)},
}
MACHINE = machine()


class RingBuffer:
    """The plain alternative: preallocated arrays, a write index, uniform sampling."""

    def __init__(self, signature, capacity):
        self.data = {k: np.zeros((capacity, *s), dtype=d) for k, (s, d) in signature.items()}
        self.capacity, self.index, self.size = capacity, 0, 0
        self.rng = np.random.default_rng(0)

    def insert(self, item):
        for k, v in item.items():
            self.data[k][self.index] = v
        self.index = (self.index + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, n):
        idx = self.rng.integers(self.size, size=n)
        return {k: v[idx] for k, v in self.data.items()}


def emit(**row):
    print(json.dumps(dict(bench="replay_throughput", **row, machine=MACHINE)), flush=True)


def timed(fn, seconds: float) -> tuple[int, float]:
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return calls, time.perf_counter() - start


def run(kind: str, name: str, seconds: float) -> None:
    signature = ITEMS[kind]
    rng = np.random.default_rng(0)
    items = [
        {k: (rng.integers(0, 255, s) if d == np.uint8 else rng.normal(size=s)).astype(d)
         for k, (s, d) in signature.items()}
        for _ in range(64)
    ]  # fmt: skip
    if name == "numpy_ring":
        store = RingBuffer(signature, CAPACITY[kind])
        insert, sample = store.insert, store.sample
    else:
        sampler = Uniform() if name == "uniform" else Prioritized(0.6)
        store = Table(name, signature, CAPACITY[kind], sampler, rate_limiter=MinSize(1))
        insert, sample = store.insert, store.sample
    n = 0

    def insert_one():
        nonlocal n
        insert(items[n % 64])
        n += 1

    calls, elapsed = timed(insert_one, seconds)
    size = dict(size=min(n, CAPACITY[kind]), capacity=CAPACITY[kind])
    emit(item=kind, store=name, op="insert", items_per_s=round(calls / elapsed, 1), **size)
    calls, elapsed = timed(lambda: sample(BATCH), seconds)
    emit(item=kind, store=name, op="sample", batch=BATCH,
         items_per_s=round(calls * BATCH / elapsed, 1), **size)  # fmt: skip
    if name == "prioritized":
        keys = store.sample(BATCH).keys
        prios = rng.uniform(0.1, 2.0, size=BATCH)
        calls, elapsed = timed(lambda: store.update_priorities(keys, prios), seconds)
        emit(item=kind, store=name, op="update_priorities", batch=BATCH,
             items_per_s=round(calls * BATCH / elapsed, 1), **size)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--atari-capacity", type=int, default=CAPACITY["atari"])
    args = parser.parse_args()
    CAPACITY["atari"] = args.atari_capacity
    for kind in ITEMS:
        for name in ("numpy_ring", "uniform", "prioritized"):
            run(kind, name, args.seconds)


if __name__ == "__main__":
    main()
