"""What watching for divergence costs a learner: DQN updates per second with the watch on
(``learner.step()``, which reads the parameters' norm and the losses every ``CHECK_PERIOD``
steps: :mod:`rlherd.run.divergence`) and off (``learner.learn(next(dataset))``, the same
update without it), on one learner, in interleaved turns (this kind of machine's speed drifts
within minutes; taking turns spreads the drift over both alike).

The update is the whole learner step: sample a batch from the preset's prioritised replay
table (random transitions beyond its minimum size), update, write priorities back. Prints one
JSON line per (network, path), and one with their ratio and what one reading of the watch costs,
timed alone, as a share of the updates' time. Usage:
  python benchmarks/divergence_cost.py [--seconds 20] [--slices 40]
      [--setups classic rlzoo minatar_paper]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from rlherd import envs
from rlherd.agents import BUILDERS
from rlherd.commands.train import resolve_config
from rlherd.replay import MinSize
from rlherd.run import divergence
from rlherd.run.provenance import machine
from rlherd.runtime import torch_threads

SETUPS = {"classic": "CartPole-v1", "rlzoo": "CartPole-v1", "minatar_paper": "MinAtar/Breakout-v1"}
MACHINE = machine()


def make_learner(setup: str):
    """The preset's DQN learner over a table of random transitions, with no rate limiter."""
    config, _ = resolve_config("dqn", SETUPS[setup], setup, {})
    builder = BUILDERS["dqn"](config)
    spec = envs.spec_for(SETUPS[setup])
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    tables = builder.make_replay_tables(spec, insert_blocking=False)
    tables[0].limiter = MinSize(1)
    adder = builder.make_adder(tables, 1)

    def obs() -> np.ndarray:
        if spec.obs_dtype == np.uint8:
            return rng.integers(0, 2, size=(1, *spec.obs_shape)).astype(np.uint8)
        return rng.standard_normal((1, *spec.obs_shape)).astype(spec.obs_dtype)

    no = np.zeros(1, dtype=bool)
    adder.add_first(obs(), np.ones(1, dtype=bool))
    for _ in range(config.min_replay_size + 1_000):
        adder.add(rng.integers(spec.num_actions, size=1), rng.standard_normal(1), obs(),
                  no, no, no)  # fmt: skip
    dataset = builder.make_dataset(tables)
    return builder.make_learner(builder.make_networks(spec), dataset, 10**9, tables), config


def measure(setup: str, seconds: float, slices: int) -> list[dict]:
    learner, config = make_learner(setup)
    paths = {"unwatched": lambda: learner.learn(next(learner.dataset)), "watched": learner.step}
    updates, elapsed = dict.fromkeys(paths, 0), dict.fromkeys(paths, 0.0)
    for _ in range(20):  # warm up
        learner.step()
    for _ in range(slices):
        for name, update in paths.items():
            start = time.perf_counter()
            while time.perf_counter() - start < seconds / slices:
                update()
                updates[name] += 1
            elapsed[name] += time.perf_counter() - start
    rates = {name: updates[name] / elapsed[name] for name in paths}
    reading = time_reading(learner)
    common = dict(bench="divergence_cost", agent="dqn", network=setup, env=SETUPS[setup],
                  batch_size=config.batch_size, check_period=divergence.CHECK_PERIOD,
                  machine=MACHINE)  # fmt: skip
    rows = [dict(common, path=name, updates_per_s=round(rate, 1)) for name, rate in rates.items()]
    ratio = rates["watched"] / rates["unwatched"]
    share = reading / divergence.CHECK_PERIOD * rates["unwatched"]
    rows.append(dict(common, watched_over_unwatched=round(ratio, 4),
                     reading_us=round(reading * 1e6, 1),
                     reading_share_of_update_time=round(share, 5)))  # fmt: skip
    return rows


def time_reading(learner, n: int = 2_000) -> float:
    """Seconds one reading of the watch takes (the parameters' norm and the losses): measured
    alone, where the interleaved rates' difference is within this machine's drift."""
    metrics = learner.step()
    start = time.perf_counter()
    for _ in range(n):
        norm = divergence.parameter_norm(learner.net.parameters())
        learner.divergence.observe(learner.num_steps, norm, metrics)
    return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="per path and network")
    parser.add_argument("--slices", type=int, default=40, help="interleaved turns per path")
    parser.add_argument("--setups", nargs="+", default=["classic"], choices=list(SETUPS))
    args = parser.parse_args()
    torch_threads(1)
    for setup in args.setups:
        for row in measure(setup, args.seconds, args.slices):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
