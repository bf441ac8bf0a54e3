"""The categorical projection and cross-entropy of D4PG / DMPO against naive per-atom code."""

import math

import pytest
import torch

from rlherd.losses.distributional import (
    categorical_cross_entropy,
    categorical_mean,
    categorical_projection,
)


def naive_projection(probs, atoms, reward, discount):
    """C51's algorithm 1, one atom at a time."""
    vmin, vmax, n = atoms[0], atoms[-1], len(atoms)
    dz = (vmax - vmin) / (n - 1)
    out = [[0.0] * n for _ in range(len(reward))]
    for i in range(len(reward)):
        for j in range(n):
            tz = min(max(reward[i] + discount[i] * atoms[j], vmin), vmax)
            b = (tz - vmin) / dz
            lo, hi = math.floor(b), math.ceil(b)
            if lo == hi:
                out[i][lo] += probs[i][j]
            else:
                out[i][lo] += probs[i][j] * (hi - b)
                out[i][hi] += probs[i][j] * (b - lo)
    return out


def batch(seed=0, B=7, N=11):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(B, N, generator=g, dtype=torch.float64), -1)
    atoms = torch.linspace(-10.0, 10.0, N, dtype=torch.float64)
    reward = torch.tensor([0.3, -4.0, 25.0, -30.0, 2.0, 0.0, 7.5], dtype=torch.float64)
    # Bootstrap factors: mid-episode n-step, terminated (0), truncated after 2 steps, exact atom.
    discount = torch.tensor([0.99**3, 0.0, 0.99**3, 0.9, 0.99**2, 1.0, 0.5], dtype=torch.float64)
    return probs, atoms, reward, discount


def test_projection_matches_c51s_algorithm():
    probs, atoms, reward, discount = batch()
    got = categorical_projection(probs, atoms, reward, discount)
    want = naive_projection(probs.tolist(), atoms.tolist(), reward.tolist(), discount.tolist())
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))
    torch.testing.assert_close(got.sum(-1), torch.ones(len(reward), dtype=torch.float64))


def test_terminated_puts_all_mass_on_the_return_and_truncated_bootstraps():
    probs, atoms, _, _ = batch()
    reward = torch.tensor([3.0, 0.1], dtype=torch.float64)
    p = probs[:2]
    terminated, truncated = categorical_projection(
        p, atoms, reward, torch.tensor([0.0, 0.99**2], dtype=torch.float64)
    )
    # 3.0 sits halfway between the atoms 2 and 4 (indices 6 and 7): half the mass on each.
    assert terminated[6].item() == pytest.approx(0.5) and terminated[7].item() == pytest.approx(0.5)
    # A truncated episode keeps the next state's distribution (here without reaching an end
    # atom): its mean is the return plus the discounted mean.
    mean = categorical_mean(torch.log(p[1]), atoms).item()
    assert categorical_mean(torch.log(truncated), atoms).item() == pytest.approx(
        0.1 + 0.99**2 * mean, abs=1e-9
    )


def test_cross_entropy_and_overflow_against_reference():
    probs, atoms, reward, discount = batch(1)
    target_probs = probs.clone().requires_grad_(True)
    logits = torch.randn(len(reward), len(atoms), dtype=torch.float64, requires_grad=True)
    td = categorical_cross_entropy(logits, target_probs, atoms, reward, discount)
    target = naive_projection(probs.tolist(), atoms.tolist(), reward.tolist(), discount.tolist())
    for i in range(len(reward)):
        log_p = torch.log_softmax(logits[i], -1).tolist()
        want = -sum(t * lp for t, lp in zip(target[i], log_p, strict=True))
        assert td.loss[i].item() == pytest.approx(want)
        outside = sum(
            probs[i, j].item()
            for j in range(len(atoms))
            if not -10 <= reward[i].item() + discount[i].item() * atoms[j].item() <= 10
        )
        assert td.overflow[i].item() == pytest.approx(outside)
    assert td.overflow[2].item() > 0.5 and td.overflow[5].item() == 0.0
    td.loss.sum().backward()
    assert logits.grad is not None and target_probs.grad is None  # the target carries none
