"""Learner steps per second from an offline dataset: read into an in-memory replay table (what
``rlherd train AGENT --dataset ID`` does) against sampled from the dataset on disk through
Minari's own API (``MinariDataset.sample_episodes``, then one step of each episode), in one run.

The dataset is a random policy's CartPole-v1 episodes, written to a temporary Minari root. Both
paths feed the same learner the same kind of batch (one-step transitions, uniformly over
episodes on disk, uniformly over steps in the table), so the difference is where batches come
from. ``load_s`` is the one-off cost of reading the dataset into the table. Prints one JSON
line per (agent, source). Usage:
  python benchmarks/offline.py [--episodes 2000] [--seconds 10] [--agents dqn bc]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
import torch

from rlherd import envs
from rlherd.agents import BUILDERS
from rlherd.commands.collect import collect
from rlherd.commands.train import resolve_config
from rlherd.replay import offline
from rlherd.replay.dataset import ReplaySample
from rlherd.run.provenance import machine

ENV = "CartPole-v1"
MACHINE = machine()
# One-step transitions and uniform sampling on both paths (DQN's classic preset otherwise
# uses 3-step returns and prioritised replay, which reading from disk cannot give).
SETTINGS = {"dqn": dict(n_step=1, prioritized=False), "bc": {}}


class MinariBatches:
    """Batches of ``batch_size`` one-step transitions read from the dataset on disk: Minari
    samples that many episodes (without replacement: all of them if there are fewer), and each
    gives uniformly chosen steps."""

    def __init__(self, dataset, batch_size: int, discount: float, seed: int = 0):
        self.dataset, self.batch_size, self.discount = dataset, batch_size, discount
        self.rng = np.random.default_rng(seed)
        dataset.set_seed(seed)

    def __iter__(self):
        return self

    def __next__(self) -> ReplaySample:
        rows = []
        episodes = self.dataset.sample_episodes(min(self.batch_size, self.dataset.total_episodes))
        for i in range(self.batch_size):
            episode = episodes[i % len(episodes)]
            t = self.rng.integers(len(episode.rewards))
            rows.append((episode.observations[t], episode.actions[t], episode.rewards[t],
                         self.discount * (1.0 - float(episode.terminations[t])),
                         episode.observations[t + 1]))  # fmt: skip
        obs, action, reward, discount, next_obs = (np.stack(c) for c in zip(*rows, strict=True))
        data = dict(obs=torch.as_tensor(obs, dtype=torch.float32), action=torch.as_tensor(action),
                    reward=torch.as_tensor(reward, dtype=torch.float32),
                    discount=torch.as_tensor(discount, dtype=torch.float32),
                    next_obs=torch.as_tensor(next_obs, dtype=torch.float32))  # fmt: skip
        return ReplaySample(data, None, None)


def rate(fn, seconds: float) -> float:
    """Calls of ``fn`` per second over ``seconds`` (after one warm-up call)."""
    fn()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        count += 1
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--agents", nargs="+", default=["dqn", "bc"], choices=sorted(SETTINGS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        os.environ["MINARI_DATASETS_PATH"] = root
        recorded = collect(None, "cartpole/random-v0", args.episodes, env=ENV, progress=False)
        dataset = offline.load_dataset("cartpole/random-v0")
        spec = envs.spec_for(ENV)
        for agent in args.agents:
            config, _ = resolve_config(agent, ENV, None, SETTINGS[agent])
            builder = BUILDERS[agent](config)
            start = time.perf_counter()
            tables = builder.make_replay_tables(spec, False, dataset_size=dataset.total_steps)
            offline.fill(builder.make_adder(tables, 1), offline.episodes(dataset))
            load_s = time.perf_counter() - start
            discount = getattr(config, "discount", 1.0)
            sources = {"table": builder.make_dataset(tables),
                       "minari": MinariBatches(dataset, config.batch_size, discount)}  # fmt: skip
            for source, batches in sources.items():
                learner = builder.make_learner(builder.make_networks(spec), batches, 1, None)
                row = dict(benchmark="offline", agent=agent, source=source,
                           dataset_steps=recorded["steps"], batch_size=config.batch_size,
                           batches_per_s=round(rate(lambda b=batches: next(b), args.seconds), 1),
                           learner_steps_per_s=round(rate(learner.step, args.seconds), 1),
                           load_s=round(load_s, 2) if source == "table" else 0.0,
                           **MACHINE)  # fmt: skip
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
