"""Replay throughput: inserts/s and sampled items/s of rlherd's tables, next to a plain numpy
ring buffer doing the same work in the same run.

Tables (uniform and prioritized; FIFO removal), batches of 256, CartPole-sized transitions in a
table of capacity 1M, and Atari-sized items (one 4x84x84 uint8 frame stack) in one of 250k: a
1M Atari table needs 26.3 GiB, more than this 24 GiB machine can allocate (``--atari-capacity``
raises it where memory allows). Storage is preallocated once; pages are touched as it fills.
Those items are random bytes, the worst case for a store. ``atari_frames`` are frame stacks of
Breakout played at random, where a table that compresses frames (``compress=True``, replay
agents' tables) holds 1M; its rows say how many bytes an item takes there.

Prints one JSON line per figure. Usage: python benchmarks/replay_throughput.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from rlherd import envs
from rlherd.replay import MinSize, Prioritized, Table, Uniform
from rlherd.run.provenance import machine

CAPACITY = {"cartpole": 1_000_000, "atari": 250_000, "atari_frames": 250_000}
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
ITEMS["atari_frames"] = ITEMS["atari"]
STORES = {"cartpole": ("numpy_ring", "uniform", "prioritized"),
          "atari": ("numpy_ring", "uniform", "prioritized"),
          "atari_frames": ("numpy_ring", "uniform", "uniform_compressed")}
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


def breakout_stacks(n: int) -> list[np.ndarray]:
    """``n`` frame stacks of Breakout under random actions, spread over its episodes."""
    env = envs.make("ALE/Breakout-v5")
    env.action_space.seed(0)
    obs, _ = env.reset(seed=0)
    stacks = []
    for t in range(50 * n):
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if t % 50 == 0:
            stacks.append(np.array(obs))
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return stacks


def run(kind: str, name: str, seconds: float) -> None:
    signature = ITEMS[kind]
    rng = np.random.default_rng(0)
    items = [
        {k: (rng.integers(0, 255, s) if d == np.uint8 else rng.normal(size=s)).astype(d)
         for k, (s, d) in signature.items()}
        for _ in range(64)
    ]  # fmt: skip
    if kind == "atari_frames":
        for item, stack in zip(items, breakout_stacks(64), strict=True):
            item["obs"] = stack
    capacity = 1_000_000 if name == "uniform_compressed" else CAPACITY[kind]
    if name == "numpy_ring":
        store = RingBuffer(signature, capacity)
        insert, sample = store.insert, store.sample
    else:
        sampler = Prioritized(0.6) if name == "prioritized" else Uniform()
        store = Table(name, signature, capacity, sampler, rate_limiter=MinSize(1),
                      compress=name == "uniform_compressed")  # fmt: skip
        insert, sample = store.insert, store.sample
    n = 0

    def insert_one():
        nonlocal n
        insert(items[n % 64])
        n += 1

    calls, elapsed = timed(insert_one, seconds)
    size = dict(size=min(n, capacity), capacity=capacity)
    if name == "uniform_compressed":
        size["bytes_per_item"] = store.stored_item_nbytes()
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
    CAPACITY["atari"] = CAPACITY["atari_frames"] = args.atari_capacity
    for kind, stores in STORES.items():
        for name in stores:
            run(kind, name, args.seconds)


if __name__ == "__main__":
    main()
