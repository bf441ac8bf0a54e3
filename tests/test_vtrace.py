"""V-trace against a plain-loop reference written from the paper's definition (eq. 1)."""

import numpy as np
import pytest
import torch

from rlherd.losses.vtrace import (
    baseline_loss,
    entropy_loss,
    policy_gradient_loss,
    vtrace_from_log_probs,
    vtrace_from_logits,
)


def reference_vtrace(blp, tlp, r, v, term, trunc, mask, gamma, lam, rho_bar, pg_rho_bar):
    """v_s = V(x_s) + sum_{t>=s} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t, the sum stopping at
    the end of the episode (a terminated or truncated step) or of the rollout. Autoreset rows
    (mask false) have v_s = V(x_s) and no advantage."""
    T, B = r.shape
    rho = np.exp(tlp - blp)
    vs = np.zeros((T, B))
    adv = np.zeros((T, B))
    for b in range(B):

        def delta(t, b=b):
            g = 0.0 if term[t, b] else gamma
            return min(rho_bar, rho[t, b]) * (r[t, b] + g * v[t + 1, b] - v[t, b])

        for s in range(T):
            if not mask[s, b]:
                vs[s, b] = v[s, b]
                continue
            total, weight = 0.0, 1.0
            for t in range(s, T):
                total += weight * delta(t)
                if term[t, b] or trunc[t, b]:
                    break
                weight *= gamma * lam * min(1.0, rho[t, b])
            vs[s, b] = v[s, b] + total
        for s in range(T):
            if not mask[s, b]:
                continue
            g = 0.0 if term[s, b] else gamma
            nxt = vs[s + 1, b] if s + 1 < T else v[T, b]
            adv[s, b] = min(pg_rho_bar, rho[s, b]) * (r[s, b] + g * nxt - v[s, b])
    return vs, adv


def random_rollout(T=13, B=7, seed=0):
    """Random rollout following rlherd's layout: a step after a terminated or truncated one is an
    autoreset row (masked, reward 0, flags false)."""
    rng = np.random.default_rng(seed)
    term = np.zeros((T, B), bool)
    trunc = np.zeros((T, B), bool)
    mask = np.ones((T, B), bool)
    r = rng.normal(size=(T, B))
    for b in range(B):
        mask[0, b] = rng.random() > 0.2  # the rollout may start on a final observation
        for t in range(T):
            if t > 0 and (term[t - 1, b] or trunc[t - 1, b]):
                mask[t, b] = False
            if not mask[t, b]:
                r[t, b] = 0.0
                continue
            u = rng.random()
            term[t, b] = u < 0.15
            trunc[t, b] = 0.15 <= u < 0.25
    blp = np.log(rng.uniform(0.05, 1.0, size=(T, B)))
    tlp = np.log(rng.uniform(0.05, 1.0, size=(T, B)))
    v = rng.normal(size=(T + 1, B))
    return blp, tlp, r, v, term, trunc, mask


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    "gamma,lam,rho_bar,pg_rho_bar", [(0.99, 1.0, 1.0, 1.0), (0.9, 0.95, 2.0, 0.5)]
)
def test_vtrace_matches_reference(seed, gamma, lam, rho_bar, pg_rho_bar):
    blp, tlp, r, v, term, trunc, mask = random_rollout(seed=seed)
    assert term.any() and trunc.any() and (~mask).any()
    expected_vs, expected_adv = reference_vtrace(
        blp, tlp, r, v, term, trunc, mask, gamma, lam, rho_bar, pg_rho_bar
    )
    t = lambda x: torch.as_tensor(x, dtype=torch.float64) if x.dtype != bool else torch.as_tensor(x)
    out = vtrace_from_log_probs(
        t(blp), t(tlp), t(r), t(v), t(term), t(trunc), t(mask),
        discount=gamma, lambda_=lam, clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar,
    )  # fmt: skip
    np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_adv, rtol=1e-10, atol=1e-10)


def test_on_policy_vtrace_is_n_step_return():
    """With rho = 1 and lambda = 1, v_s is the discounted return bootstrapped at the end."""
    T, B, gamma = 5, 1, 0.9
    r = torch.arange(1.0, T + 1).reshape(T, B)
    v = torch.full((T + 1, B), 2.0)
    lp = torch.zeros(T, B)
    f = torch.zeros(T, B, dtype=torch.bool)
    out = vtrace_from_log_probs(lp, lp, r, v, f, f, ~f, discount=gamma)
    expected = sum(gamma**k * (k + 1) for k in range(T)) + gamma**T * 2.0
    assert out.vs[0, 0].item() == pytest.approx(expected)


def test_from_logits_and_loss_terms():
    torch.manual_seed(0)
    T, B, A = 4, 3, 5
    bl, tl = torch.randn(T, B, A), torch.randn(T, B, A, requires_grad=True)
    actions = torch.randint(A, (T, B))
    f = torch.zeros(T, B, dtype=torch.bool)
    mask = torch.ones(T, B, dtype=torch.bool)
    mask[1, 2] = False
    out = vtrace_from_logits(bl, tl, actions, torch.randn(T, B), torch.randn(T + 1, B), f, f, mask)
    lp = torch.log_softmax(tl, -1).gather(-1, actions[..., None])[..., 0]
    blp = torch.log_softmax(bl, -1).gather(-1, actions[..., None])[..., 0]
    torch.testing.assert_close(out.log_rhos, (lp - blp).detach())
    pg = policy_gradient_loss(tl, actions, out.pg_advantages, mask)
    torch.testing.assert_close(pg, -(lp * out.pg_advantages * mask).sum())
    p = torch.softmax(tl, -1)
    ent = sum((p[t, b] * p[t, b].log()).sum() for t in range(T) for b in range(B) if mask[t, b])
    torch.testing.assert_close(entropy_loss(tl, mask), ent)
    vals = torch.randn(T, B)
    torch.testing.assert_close(
        baseline_loss(vals, out.vs, mask), 0.5 * (((out.vs - vals) ** 2) * mask).sum()
    )
    assert out.pg_advantages[1, 2] == 0


def test_values_must_have_bootstrap_row():
    z = torch.zeros(3, 2)
    f = torch.zeros(3, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="T \\+ 1"):
        vtrace_from_log_probs(z, z, z, z, f, f, ~f)
