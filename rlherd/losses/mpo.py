"""Maximum a posteriori Policy Optimisation's policy loss (MPO: Abdolmaleki et al. 2018a/b), as
pure functions of tensors.

MPO improves the policy in two steps over actions sampled from the target policy at each state:

- **E-step**: weigh the ``S`` samples by ``softmax(Q / temperature)``, the best non-parametric
  policy whose KL from the target policy stays under ``epsilon``. The temperature is a Lagrange
  multiplier learned by minimising the dual ``temperature * (epsilon + mean log mean exp(Q /
  temperature))`` (:func:`temperature_dual`), which raises it when the weights are too far from
  uniform and lowers it when they are too close.
- **M-step**: fit the parametric policy to the weighted samples (weighted maximum likelihood)
  under KL trust regions from the target policy. The fit is decoupled (Abdolmaleki et al. 2018b):
  the mean is fitted with the target's standard deviation and the standard deviation with the
  target's mean, each under its own bound (``epsilon_mean``, ``epsilon_stddev``) and multiplier
  ``alpha`` (:func:`kl_penalty_and_dual`), per action dimension or over the whole action.

Action penalisation (Abdolmaleki et al. 2020, "A distributional view on multi-objective policy
optimization") adds a second objective, ``-||a - clip(a, -1, 1)||``, with its own temperature and
bound ``epsilon_penalty``, which keeps the Gaussian's mass inside the action box.

Multipliers are passed as raw parameters and made positive with ``softplus(x) + 1e-8`` (Acme's
parameterisation); gradient descent on the returned loss updates policy and multipliers at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as nnf

MULTIPLIER_EPS = 1e-8
# Learners clamp raw multipliers here (Acme's floor): softplus's gradient, sigmoid(raw), would
# otherwise vanish and leave a multiplier stuck near zero.
MIN_RAW_MULTIPLIER = -18.0


def positive(raw: torch.Tensor) -> torch.Tensor:
    """A Lagrange multiplier from its raw parameter: ``softplus(raw) + 1e-8``."""
    return nnf.softplus(raw) + MULTIPLIER_EPS


def temperature_dual(
    q_values: torch.Tensor, temperature: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The E-step over ``S`` samples of ``B`` states (``q_values [S, B]``).

    Returns the sample weights ``softmax_s(Q / temperature)`` (no gradient), the temperature's
    dual loss ``temperature * (epsilon + mean_b logsumexp_s(Q / temperature) - log S)`` (its
    gradient is ``epsilon - KL(weights || uniform)``: descent raises the temperature when the
    weights break the bound) and that KL itself, averaged over states."""
    tempered = q_values.detach() / temperature
    weights = torch.softmax(tempered, 0).detach()
    log_num_samples = math.log(q_values.shape[0])
    loss = temperature * (epsilon + torch.logsumexp(tempered, 0).mean() - log_num_samples)
    kl = (weights * (torch.log(weights.clamp_min(1e-30)) + log_num_samples)).sum(0).mean()
    return weights, loss, kl.detach()


def kl_penalty_and_dual(
    kl: torch.Tensor, alpha: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The M-step's trust region for ``kl [B]`` or ``[B, D]`` (one multiplier per dimension):
    the policy's penalty ``alpha * mean_b KL`` (alpha held fixed) and the multiplier's dual loss
    ``alpha * (epsilon - mean_b KL)`` (KL held fixed), whose descent raises alpha when the KL
    exceeds ``epsilon`` and lowers it otherwise."""
    mean_kl = kl.mean(0)
    penalty = (alpha.detach() * mean_kl).sum()
    dual = (alpha * (epsilon - mean_kl.detach())).sum()
    return penalty, dual


def gaussian_kl(
    mean_p: torch.Tensor, std_p: torch.Tensor, mean_q: torch.Tensor, std_q: torch.Tensor
) -> torch.Tensor:
    """``KL(N(mean_p, std_p) || N(mean_q, std_q))`` per dimension."""
    return (
        torch.log(std_q / std_p)
        + (std_p.square() + (mean_p - mean_q).square()) / (2 * std_q.square())
        - 0.5
    )


def gaussian_log_prob(actions: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Log-density of a diagonal Gaussian, summed over the last (action) dimension."""
    z = (actions - mean) / std
    return (-0.5 * z.square() - torch.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)


@dataclass(frozen=True)
class MPOBounds:
    """The KL bounds of MPO's two steps (Acme's defaults; see rlherd/agents/mpo/config.py)."""

    epsilon: float = 0.1  # E-step: KL(weights || target policy)
    epsilon_mean: float = 2.5e-3  # M-step: KL of the mean's update
    epsilon_stddev: float = 1e-6  # M-step: KL of the standard deviation's update
    epsilon_penalty: float | None = 1e-3  # action penalisation's bound; None: off
    per_dim_constraining: bool = True  # one multiplier (and bound) per action dimension


class MPOLoss(NamedTuple):
    loss: torch.Tensor  # policy + KL penalties + all dual losses: minimise it
    stats: dict[str, torch.Tensor]


def gaussian_mpo_loss(
    online_mean: torch.Tensor,
    online_std: torch.Tensor,
    target_mean: torch.Tensor,
    target_std: torch.Tensor,
    actions: torch.Tensor,
    q_values: torch.Tensor,
    raw_temperature: torch.Tensor,
    raw_alpha_mean: torch.Tensor,
    raw_alpha_stddev: torch.Tensor,
    raw_penalty_temperature: torch.Tensor | None,
    bounds: MPOBounds,
) -> MPOLoss:
    """MPO's loss for a diagonal Gaussian policy (Acme's ``MPO`` loss).

    ``online_*`` / ``target_* [B, D]``: the online and target policies' Gaussians at ``B``
    states; ``actions [S, B, D]``: samples from the target policy; ``q_values [S, B]``: the
    critic's values of those samples. The alphas have shape ``[D]`` with
    ``per_dim_constraining`` and ``[]`` otherwise."""
    temperature = positive(raw_temperature)
    weights, loss_temperature, kl_q = temperature_dual(q_values, temperature, bounds.epsilon)
    stats = dict(temperature=temperature.detach(), kl_q_rel=kl_q / bounds.epsilon)
    if bounds.epsilon_penalty is not None:
        excess = actions - actions.clamp(-1.0, 1.0)
        cost = -excess.norm(dim=-1)  # [S, B]: 0 inside the box
        penalty_temperature = positive(raw_penalty_temperature)
        penalty_weights, loss_penalty, _ = temperature_dual(
            cost, penalty_temperature, bounds.epsilon_penalty
        )
        weights = weights + penalty_weights
        loss_temperature = loss_temperature + loss_penalty
        stats["penalty_temperature"] = penalty_temperature.detach()

    # M-step, decoupled: the mean fitted with the target's std, the std with the target's mean.
    log_prob_mean = gaussian_log_prob(actions, online_mean, target_std)
    log_prob_std = gaussian_log_prob(actions, target_mean, online_std)
    loss_policy = -((weights * log_prob_mean).sum(0) + (weights * log_prob_std).sum(0)).mean()

    kl_mean = gaussian_kl(target_mean, target_std, online_mean, target_std)  # [B, D]
    kl_std = gaussian_kl(target_mean, target_std, target_mean, online_std)
    if not bounds.per_dim_constraining:
        kl_mean, kl_std = kl_mean.sum(-1), kl_std.sum(-1)
    alpha_mean, alpha_std = positive(raw_alpha_mean), positive(raw_alpha_stddev)
    penalty_mean, dual_mean = kl_penalty_and_dual(kl_mean, alpha_mean, bounds.epsilon_mean)
    penalty_std, dual_std = kl_penalty_and_dual(kl_std, alpha_std, bounds.epsilon_stddev)

    loss = loss_policy + penalty_mean + penalty_std + dual_mean + dual_std + loss_temperature
    stats.update(
        loss_policy=loss_policy.detach(),
        alpha_mean=alpha_mean.detach().mean(),
        alpha_stddev=alpha_std.detach().mean(),
        kl_mean_rel=kl_mean.detach().mean(0).max() / bounds.epsilon_mean,
        kl_stddev_rel=kl_std.detach().mean(0).max() / bounds.epsilon_stddev,
        policy_std=online_std.detach().mean(),
    )
    return MPOLoss(loss, stats)


def categorical_mpo_loss(
    online_logits: torch.Tensor,
    target_logits: torch.Tensor,
    q_values: torch.Tensor,
    raw_temperature: torch.Tensor,
    raw_alpha: torch.Tensor,
    epsilon: float = 0.1,
    epsilon_policy: float = 1e-3,
) -> MPOLoss:
    """MPO for a categorical policy over ``A`` actions, where the E-step can enumerate every
    action instead of sampling: ``q_values [A, B]`` for all of them.

    The non-parametric policy is ``target_pi(a) * exp(Q(a) / temperature)``, normalised; the
    temperature's dual is ``temperature * (epsilon + mean_b log sum_a target_pi(a) exp(Q(a) /
    temperature))``. The M-step fits the online policy to it by cross-entropy under one KL bound
    ``epsilon_policy`` from the target policy."""
    temperature = positive(raw_temperature)
    target_log_pi = torch.log_softmax(target_logits.detach(), -1).T  # [A, B]
    tempered = q_values.detach() / temperature + target_log_pi
    weights = torch.softmax(tempered, 0).detach()
    loss_temperature = temperature * (epsilon + torch.logsumexp(tempered, 0).mean())
    kl_q = (weights * (torch.log(weights.clamp_min(1e-30)) - target_log_pi)).sum(0).mean()

    online_log_pi = torch.log_softmax(online_logits, -1)  # [B, A]
    loss_policy = -(weights.T * online_log_pi).sum(-1).mean()
    target_pi = target_log_pi.T.exp()
    kl = (target_pi * (target_log_pi.T - online_log_pi)).sum(-1)  # KL(target || online), [B]
    alpha = positive(raw_alpha)
    penalty, dual = kl_penalty_and_dual(kl, alpha, epsilon_policy)
    stats = dict(
        temperature=temperature.detach(),
        alpha=alpha.detach(),
        kl_q_rel=kl_q.detach() / epsilon,
        kl_rel=kl.detach().mean() / epsilon_policy,
        loss_policy=loss_policy.detach(),
    )
    return MPOLoss(loss_policy + penalty + dual + loss_temperature, stats)
