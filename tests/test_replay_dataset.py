"""ReplayDataset: tensors on the device, sample info, importance weights, prefetching."""

import time

import numpy as np
import pytest
import torch

from rlherd.replay import (
    MinSize,
    Prioritized,
    RateLimiterTimeout,
    ReplayDataset,
    Table,
    Uniform,
    importance_weights,
)

SIG = {"x": ((3,), np.float32), "a": ((), np.int64)}


def table(sampler, n=4, priorities=(1.0, 2.0, 3.0, 4.0), min_size=1):
    t = Table("t", SIG, 100, sampler, rate_limiter=MinSize(min_size))
    for i in range(n):
        t.insert({"x": np.full(3, i, np.float32), "a": np.int64(i)}, priority=priorities[i])
    return t


def test_importance_weights_hand_computed():
    p = np.array([0.1, 0.4, 0.5])
    w = importance_weights(p, np.array([4, 4, 4]), beta=0.5)
    raw = (4 * p) ** -0.5
    np.testing.assert_allclose(w, raw / raw.max())
    assert w.max() == 1.0 and w[0] == 1.0  # the rarest sample gets the largest weight


def test_batches_are_tensors_with_info_and_weights():
    ds = ReplayDataset(table(Prioritized(1.0)), batch_size=8, importance_beta=lambda: 1.0)
    sample = next(ds)
    assert sample.data["x"].dtype == torch.float32 and sample.data["x"].shape == (8, 3)
    assert sample.data["a"].dtype == torch.int64
    info = sample.info
    np.testing.assert_allclose(info.probabilities, (sample.data["a"].numpy() + 1) / 10)
    assert (info.table_size == 4).all() and len(info.keys) == 8
    expected = 1 / (4 * info.probabilities)
    np.testing.assert_allclose(sample.weights.numpy(), expected / expected.max(), rtol=1e-6)


def test_ready_follows_the_rate_limiter():
    t = table(Uniform(), n=2, min_size=3)
    ds = ReplayDataset(t, batch_size=4)
    assert not ds.ready()
    t.insert({"x": np.zeros(3, np.float32), "a": np.int64(9)})
    assert ds.ready()
    assert next(ds).weights is None


def test_prefetch_thread_fills_and_stops():
    t = table(Uniform())
    ds = ReplayDataset(t, batch_size=2, prefetch=3)
    deadline = time.monotonic() + 5
    while not ds.ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ds.ready()
    batches = [next(ds) for _ in range(5)]
    assert all(b.data["x"].shape == (2, 3) for b in batches)
    ds.close()
    assert not [t for t in __import__("threading").enumerate() if t.name == "prefetch"]


def test_timeout_when_nothing_can_be_sampled():
    ds = ReplayDataset(table(Uniform(), n=1, min_size=5), batch_size=2, timeout=0.2)
    with pytest.raises(RateLimiterTimeout):
        next(ds)
    prefetching = ReplayDataset(
        table(Uniform(), n=1, min_size=5), batch_size=2, prefetch=1, timeout=0.2
    )
    with pytest.raises(RateLimiterTimeout, match="no batch"):
        next(prefetching)
    prefetching.close()
