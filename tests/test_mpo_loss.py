"""MPO's E-step and M-step against naive per-state code, and its Lagrange multipliers moving the
right way on constructed batches."""

import math

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from rlherd.losses.mpo import MPOBounds, categorical_mpo_loss, gaussian_mpo_loss, positive

S, B, D = 5, 4, 2


def gaussian_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    online_mean, target_mean = r(B, D), r(B, D)
    online_std, target_std = r(B, D).exp() * 0.5, r(B, D).exp() * 0.5
    actions = 1.5 * r(S, B, D)  # some outside [-1, 1]
    q = r(S, B) * 3
    return online_mean, online_std, target_mean, target_std, actions, q


def raw(value, shape=()):
    return torch.full(shape, value, dtype=torch.float64, requires_grad=True)


def duals(per_dim=True):
    shape = (D,) if per_dim else ()
    return raw(0.3), raw(1.0, shape), raw(2.0, shape), raw(-0.5)


def naive_gaussian_loss(om, os, tm, ts, actions, q, raws, bounds):
    """Acme's MPO loss written state by state and sample by sample, with torch.distributions'
    densities and KLs and Acme's stop-gradients (``detach``), so that its value and gradients
    can be compared."""
    eta, a_mean, a_std, eta_pen = (torch.nn.functional.softplus(r) + 1e-8 for r in raws)

    def e_step(values, temperature, epsilon):
        """Per state: sample weights (no gradient) and the temperature's dual."""
        weights, lse_sum = [], 0.0
        for b in range(B):
            tempered = torch.stack([values[s][b].detach() / temperature for s in range(S)])
            lse_sum = lse_sum + torch.logsumexp(tempered, 0)
            weights.append(torch.softmax(tempered, 0).detach())
        return weights, temperature * (epsilon + lse_sum / B - math.log(S))

    cost = [[-(actions[s, b] - actions[s, b].clamp(-1, 1)).norm() for b in range(B)]
            for s in range(S)]  # fmt: skip
    weights, loss_eta = e_step(q, eta, bounds.epsilon)
    pen_weights, loss_pen = e_step(cost, eta_pen, bounds.epsilon_penalty)
    loss = loss_eta + loss_pen
    kl_mean, kl_std = [], []
    for b in range(B):
        fixed_std, fixed_mean = Normal(om[b], ts[b]), Normal(tm[b], os[b])
        for s in range(S):
            w = weights[b][s] + pen_weights[b][s]
            loss = loss - w * fixed_std.log_prob(actions[s, b]).sum() / B
            loss = loss - w * fixed_mean.log_prob(actions[s, b]).sum() / B
        target = Normal(tm[b], ts[b])
        kl_mean.append(kl_divergence(target, fixed_std))  # [D]
        kl_std.append(kl_divergence(target, fixed_mean))
    for kl, alpha, eps in ((kl_mean, a_mean, bounds.epsilon_mean),
                           (kl_std, a_std, bounds.epsilon_stddev)):  # fmt: skip
        mean_kl = torch.stack(kl).mean(0)  # [D]
        if not bounds.per_dim_constraining:
            mean_kl = mean_kl.sum()
        loss = loss + (alpha.detach() * mean_kl).sum() + (alpha * (eps - mean_kl.detach())).sum()
    return loss


@pytest.mark.parametrize("per_dim", [True, False])
def test_gaussian_loss_and_its_gradients_match_reference(per_dim):
    """Values and gradients, with respect to the online Gaussian and every multiplier: a KL
    taken the wrong way round or a distribution held fixed on the wrong side shows here."""
    bounds = MPOBounds(per_dim_constraining=per_dim)
    om, os, tm, ts, actions, q = gaussian_batch()
    got_inputs = [om.clone().requires_grad_(True), os.clone().requires_grad_(True)]
    want_inputs = [om.clone().requires_grad_(True), os.clone().requires_grad_(True)]
    got_raws, want_raws = duals(per_dim), duals(per_dim)
    got = gaussian_mpo_loss(*got_inputs, tm, ts, actions, q, *got_raws, bounds).loss
    want = naive_gaussian_loss(*want_inputs, tm, ts, actions, q, want_raws, bounds)
    assert got.item() == pytest.approx(want.item(), rel=1e-9)
    got.backward()
    want.backward()
    for g, w in zip([*got_inputs, *got_raws], [*want_inputs, *want_raws], strict=True):
        torch.testing.assert_close(g.grad, w.grad, rtol=1e-9, atol=1e-12)


def grads(**changes):
    """The gradient of the loss with respect to each raw multiplier (descent subtracts it)."""
    om, os, tm, ts, actions, q = gaussian_batch(1)
    batch = dict(online_mean=om, online_std=os, target_mean=tm, target_std=ts, actions=actions,
                 q_values=q)  # fmt: skip
    batch.update(changes)
    raws = dict(zip(("raw_temperature", "raw_alpha_mean", "raw_alpha_stddev",
                     "raw_penalty_temperature"), duals(), strict=True))  # fmt: skip
    gaussian_mpo_loss(**batch, **raws, bounds=MPOBounds()).loss.backward()
    return {k: v.grad for k, v in raws.items()}


def test_temperature_rises_when_the_weights_break_the_kl_bound():
    _, _, _, _, _, q = gaussian_batch(1)
    peaked = grads(q_values=q * 100)  # near one-hot weights: KL ~ log S > epsilon
    flat = grads(q_values=torch.zeros_like(q))  # uniform weights: KL = 0 < epsilon
    assert peaked["raw_temperature"] < 0 < flat["raw_temperature"]


def test_alphas_rise_when_the_policy_moves_too_far_and_fall_when_it_stays():
    om, os, tm, ts, _, _ = gaussian_batch(1)
    moved = grads(online_mean=tm + 1.0, online_std=ts * 2)
    stayed = grads(online_mean=tm.clone(), online_std=ts.clone())
    assert (moved["raw_alpha_mean"] < 0).all() and (stayed["raw_alpha_mean"] > 0).all()
    assert (moved["raw_alpha_stddev"] < 0).all() and (stayed["raw_alpha_stddev"] > 0).all()


def test_action_penalty_pulls_the_mean_into_the_box():
    om, os, tm, ts, actions, q = gaussian_batch(2)
    # Equal Q everywhere: only the penalty prefers anything. Samples straddle +1.
    actions = torch.linspace(0.0, 3.0, S, dtype=torch.float64)[:, None, None].expand(S, B, D)
    mean = torch.full((B, D), 1.5, dtype=torch.float64, requires_grad=True)
    std = torch.ones(B, D, dtype=torch.float64)
    raws = duals()
    off = gaussian_mpo_loss(mean, std, mean.detach(), std, actions, torch.zeros(S, B), *raws,
                            MPOBounds(epsilon_penalty=None)).loss  # fmt: skip
    (grad_off,) = torch.autograd.grad(off, mean)
    on = gaussian_mpo_loss(mean, std, mean.detach(), std, actions, torch.zeros(S, B), *raws,
                           MPOBounds()).loss  # fmt: skip
    (grad_on,) = torch.autograd.grad(on, mean)
    assert (grad_on > grad_off).all()  # descent moves the mean lower, towards the box


def test_categorical_loss_matches_reference_and_its_duals_move_the_right_way():
    g = torch.Generator().manual_seed(0)
    A = 3
    online = torch.randn(B, A, generator=g, dtype=torch.float64)
    target = torch.randn(B, A, generator=g, dtype=torch.float64)
    q = torch.randn(A, B, generator=g, dtype=torch.float64)
    got_in, want_in = online.clone().requires_grad_(True), online.clone().requires_grad_(True)
    got_raws, want_raws = (raw(0.2), raw(-1.0)), (raw(0.2), raw(-1.0))
    got = categorical_mpo_loss(got_in, target, q, *got_raws, 0.1, 1e-3).loss
    # Reference, state by state: weights prior(a) exp(Q(a) / eta) normalised (no gradient),
    # the temperature's dual, cross-entropy to the weights, KL(target || online) under alpha.
    eta, alpha = (torch.nn.functional.softplus(r) + 1e-8 for r in want_raws)
    want, kl_sum = 0.0, 0.0
    for b in range(B):
        log_prior = torch.log_softmax(target[b], -1)
        log_pi = torch.log_softmax(want_in[b], -1)
        scores = log_prior + q[:, b] / eta
        want = want + eta * (0.1 + torch.logsumexp(scores, 0)) / B
        want = want - (torch.softmax(scores, 0).detach() * log_pi).sum() / B
        kl_sum = kl_sum + (log_prior.exp() * (log_prior - log_pi)).sum()
    want = want + alpha.detach() * kl_sum / B + alpha * (1e-3 - kl_sum.detach() / B)
    assert got.item() == pytest.approx(want.item(), rel=1e-9)
    got.backward()
    want.backward()
    for mine, ref in zip([got_in, *got_raws], [want_in, *want_raws], strict=True):
        torch.testing.assert_close(mine.grad, ref.grad, rtol=1e-9, atol=1e-12)
    assert got_raws[1].grad < 0  # the online policy differs from the target: KL > 1e-3
    same = target.clone().requires_grad_(True)
    a_raw = raw(-1.0)
    categorical_mpo_loss(same, target, q, raw(0.2), a_raw, 0.1, 1e-3).loss.backward()
    assert a_raw.grad > 0  # KL = 0 < 1e-3: alpha falls


def test_multipliers_are_positive():
    assert positive(torch.tensor(-18.0)).item() > 0
    assert positive(torch.tensor(0.0)).item() == pytest.approx(math.log(2))
