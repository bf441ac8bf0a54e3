"""GAE against a plain-loop reference; the running normaliser against numpy over the stream."""

import numpy as np
import pytest
import torch
from test_vtrace import random_rollout

from rlherd.losses.gae import gae
from rlherd.networks.normalization import RunningNorm


def reference_gae(r, v, term, trunc, mask, gamma, lam):
    """A_s = sum_{t>=s} (gamma lam)^{t-s} delta_t, stopping at the episode's end."""
    T, B = r.shape
    adv = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            if not mask[s, b]:
                continue
            total, weight = 0.0, 1.0
            for t in range(s, T):
                g = 0.0 if term[t, b] else gamma
                total += weight * (r[t, b] + g * v[t + 1, b] - v[t, b])
                if term[t, b] or trunc[t, b]:
                    break
                weight *= gamma * lam
            adv[s, b] = total
    return adv


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (0.5, 0.0)])
def test_gae_matches_reference(seed, gamma, lam):
    _, _, r, v, term, trunc, mask = random_rollout(seed=seed)
    t = lambda x: torch.as_tensor(x) if x.dtype == bool else torch.as_tensor(x, dtype=torch.float64)
    adv, ret = gae(t(r), t(v), t(term), t(trunc), t(mask), gamma, lam)
    expected = reference_gae(r, v, term, trunc, mask, gamma, lam)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ret.numpy(), expected + v[:-1], rtol=1e-10, atol=1e-10)


def test_running_norm_equals_numpy_over_the_stream():
    rng = np.random.default_rng(0)
    norm = RunningNorm((3,), clip=5.0)
    chunks = [rng.normal(loc=[1, -2, 10], scale=[1, 3, 0.1], size=(n, 3)) for n in (1, 7, 100, 3)]
    for c in chunks:
        norm.update(torch.as_tensor(c))
    stream = np.concatenate(chunks)
    np.testing.assert_allclose(norm.mean.numpy(), stream.mean(0), rtol=1e-10)
    np.testing.assert_allclose(norm.var.numpy(), stream.var(0), rtol=1e-10)
    x = torch.tensor([[1.0, -2.0, 20.0]])
    out = norm(x)
    assert out[0, 2].item() == 5.0  # clipped
    expected = (1.0 - stream[:, 0].mean()) / np.sqrt(stream[:, 0].var() + 1e-8)
    assert out[0, 0].item() == pytest.approx(expected, rel=1e-5)
    restored = RunningNorm((3,))
    restored.load_state_dict(norm.state_dict())  # the statistics travel with checkpoints
    torch.testing.assert_close(restored(x), out)
