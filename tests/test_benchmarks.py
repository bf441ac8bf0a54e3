"""The benchmarks' own stand-ins for old code paths still run against today's classes."""

import importlib.util
from pathlib import Path

import numpy as np

from rlherd.replay import Prioritized

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_learner_steps_old_sum_tree_samples_as_todays_prioritized_replay():
    """``before``'s sum-tree subclasses Prioritized: every method a table calls (insert,
    delete, update, sample) must be the tree's own, and give today's probabilities."""
    trees = [load("learner_step").SumTree(0.5), Prioritized(0.5)]
    priorities = np.array([1.0, 4.0, 0.0, 9.0, 16.0, 2.0])
    for selector in trees:
        selector.reset(100)
        for slot, p in enumerate(priorities):
            selector.insert(slot, slot, p)
        selector.delete(5)
        selector.update(np.array([0, 1]), np.array([25.0, 4.0]))
    expected = np.array([5.0, 2.0, 0.0, 3.0, 4.0]) / 14.0
    for selector in trees:
        slots, probabilities = selector.sample(2_000, np.random.default_rng(0))
        assert set(slots.tolist()) == {0, 1, 3, 4}
        np.testing.assert_allclose(probabilities, expected[slots])


def test_sac_td3_updates_drives_todays_learners():
    """benchmarks/sac_td3_updates.py's rlherd path: its table (a fixed dataset, no rate limit)
    feeds SAC's and TD3's learners as a run does. (Its Stable-Baselines3 path needs the bench
    extra, which the test install leaves out.)"""
    bench = load("sac_td3_updates")
    data = bench.random_transitions("Pendulum-v1", 600)
    for agent in ("sac", "td3"):
        bench.rlherd_updates(agent, "Pendulum-v1", data)(3)
