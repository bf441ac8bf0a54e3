"""MPO's E-step and M-step against naive per-state code, and its Lagrange multipliers moving the
right way on constructed batches."""

import math

import pytest
import torch
from torch.distributions import Normal

from rlherd.losses.mpo import MPOBounds, categorical_mpo_loss, gaussian_mpo_loss, positive

S, B, D = 5, 4, 2


def softplus(x):
    return math.log1p(math.exp(x)) + 1e-8


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
    """Acme's MPO loss written state by state and sample by sample."""
    eta, a_mean, a_std, eta_pen = (r.detach().tolist() for r in raws)
    eta, eta_pen = softplus(eta), softplus(eta_pen)
    per_dim = bounds.per_dim_constraining
    a_mean = [softplus(v) for v in a_mean] if per_dim else softplus(a_mean)
    a_std = [softplus(v) for v in a_std] if per_dim else softplus(a_std)

    def e_step(values, temperature, epsilon):
        weights, lse_sum = [], 0.0
        for b in range(B):
            col = [values[s][b] / temperature for s in range(S)]
            top = max(col)
            lse = top + math.log(sum(math.exp(c - top) for c in col))
            lse_sum += lse
            weights.append([math.exp(c - lse) for c in col])
        return weights, temperature * (epsilon + lse_sum / B - math.log(S))

    weights, loss_eta = e_step(q.tolist(), eta, bounds.epsilon)
    cost = [[-sum((a - min(max(a, -1.0), 1.0)) ** 2 for a in actions[s, b].tolist()) ** 0.5
             for b in range(B)] for s in range(S)]  # fmt: skip
    pen_weights, loss_pen = e_step(cost, eta_pen, bounds.epsilon_penalty)
    loss = loss_eta + loss_pen
    kl_mean = [[0.0] * D for _ in range(B)]
    kl_std = [[0.0] * D for _ in range(B)]
    for b in range(B):
        fixed_std = Normal(om[b], ts[b])
        fixed_mean = Normal(tm[b], os[b])
        for s in range(S):
            w = weights[b][s] + pen_weights[b][s]
            loss -= w * fixed_std.log_prob(actions[s, b]).sum().item() / B
            loss -= w * fixed_mean.log_prob(actions[s, b]).sum().item() / B
        for d in range(D):
            kl_mean[b][d] = (tm[b, d] - om[b, d]).item() ** 2 / (2 * ts[b, d].item() ** 2)
            ratio = (ts[b, d] / os[b, d]).item()
            kl_std[b][d] = -math.log(ratio) + ratio**2 / 2 - 0.5
    for kl, alpha, eps in ((kl_mean, a_mean, bounds.epsilon_mean),
                           (kl_std, a_std, bounds.epsilon_stddev)):  # fmt: skip
        if per_dim:
            for d in range(D):
                mean_kl = sum(kl[b][d] for b in range(B)) / B
                loss += alpha[d] * mean_kl + alpha[d] * (eps - mean_kl)
        else:
            mean_kl = sum(sum(kl[b]) for b in range(B)) / B
            loss += alpha * mean_kl + alpha * (eps - mean_kl)
    return loss


@pytest.mark.parametrize("per_dim", [True, False])
def test_gaussian_loss_matches_reference(per_dim):
    bounds = MPOBounds(per_dim_constraining=per_dim)
    batch = gaussian_batch()
    raws = duals(per_dim)
    got = gaussian_mpo_loss(*batch, *raws, bounds)
    want = naive_gaussian_loss(*batch, raws, bounds)
    assert got.loss.item() == pytest.approx(want, rel=1e-9)


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
    online = torch.randn(B, A, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randn(B, A, generator=g, dtype=torch.float64)
    q = torch.randn(A, B, generator=g, dtype=torch.float64)
    t_raw, a_raw = raw(0.2), raw(-1.0)
    got = categorical_mpo_loss(online, target, q, t_raw, a_raw, 0.1, 1e-3)
    eta, alpha = softplus(0.2), softplus(-1.0)
    want, kl_sum = 0.0, 0.0
    for b in range(B):
        prior = torch.softmax(target[b], -1).tolist()
        log_pi = torch.log_softmax(online[b].detach(), -1).tolist()
        scores = [math.log(prior[a]) + q[a, b].item() / eta for a in range(A)]
        lse = math.log(sum(math.exp(s) for s in scores))
        want += eta * (0.1 + lse) / B
        want -= sum(math.exp(scores[a] - lse) * log_pi[a] for a in range(A)) / B
        kl_sum += sum(prior[a] * (math.log(prior[a]) - log_pi[a]) for a in range(A))
    want += alpha * kl_sum / B + alpha * (1e-3 - kl_sum / B)
    assert got.loss.item() == pytest.approx(want, rel=1e-9)
    got.loss.backward()
    assert a_raw.grad < 0  # the online policy differs from the target: KL > 1e-3, alpha rises
    same = target.clone().requires_grad_(True)
    a_raw2 = raw(-1.0)
    categorical_mpo_loss(same, target, q, raw(0.2), a_raw2, 0.1, 1e-3).loss.backward()
    assert a_raw2.grad > 0


def test_multipliers_are_positive():
    assert positive(torch.tensor(-18.0)).item() > 0
    assert positive(torch.tensor(0.0)).item() == pytest.approx(math.log(2))
