"""PPO's objectives (Schulman et al. 2017) as pure functions of per-row tensors.

Three policy objectives share one value loss:

- :func:`clipped_surrogate_loss`: the clipped importance ratio (PPO-clip; CleanRL, SB3).
- :func:`kl_penalty_loss`: the ratio-weighted advantage with an adaptive KL penalty and a
  quadratic cut-off beyond ``cutoff_factor`` times the target (BatchPPO / TensorFlow Agents),
  with :func:`adapt_kl_beta` adjusting the penalty weight after each update.
- :func:`policy_gradient_loss`: A2C's plain policy gradient (WarpDrive's default trainer).

Inputs are flat ``[N]`` rows that are all valid: callers drop autoreset and padding rows first.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class PolicyLoss(NamedTuple):
    loss: torch.Tensor
    approx_kl: torch.Tensor  # (ratio - 1) - log ratio, averaged: a low-variance KL estimate
    clip_fraction: torch.Tensor  # rows whose ratio left [1 - clip, 1 + clip]


def clipped_surrogate_loss(
    log_prob: torch.Tensor,
    behaviour_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip: float = 0.2,
) -> PolicyLoss:
    """``-mean(min(r * A, clip(r, 1 - eps, 1 + eps) * A))`` with ``r = pi / pi_behaviour``."""
    log_ratio = log_prob - behaviour_log_prob
    ratio = log_ratio.exp()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * advantages
    loss = -torch.minimum(unclipped, clipped).mean()
    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clip_fraction = ((ratio - 1.0).abs() > clip).float().mean()
    return PolicyLoss(loss, approx_kl, clip_fraction)


def kl_penalty_loss(
    log_prob: torch.Tensor,
    behaviour_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    kl: torch.Tensor,
    beta: float,
    kl_target: float = 0.01,
    cutoff_factor: float = 2.0,
    cutoff_coef: float = 1000.0,
) -> torch.Tensor:
    """BatchPPO's policy loss: ``-mean(r * A) + beta * mean(KL) + mean(cutoff)``.

    ``kl`` is ``KL(pi_behaviour || pi)`` per row; rows whose KL exceeds ``cutoff_factor *
    kl_target`` add ``cutoff_coef * (KL - cutoff_factor * kl_target)^2`` (a wall that stops one
    update from moving the policy far, whatever beta is).
    """
    ratio = (log_prob - behaviour_log_prob).exp()
    surrogate = -(ratio * advantages).mean()
    threshold = cutoff_factor * kl_target
    cutoff = cutoff_coef * torch.relu(kl - threshold) ** 2
    return surrogate + beta * kl.mean() + cutoff.mean()


def policy_gradient_loss(log_prob: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """A2C's ``-mean(log pi(a) * A)``: PPO's objective without the ratio (one on-policy step)."""
    return -(log_prob * advantages).mean()


def adapt_kl_beta(beta: float, kl: float, kl_target: float = 0.01) -> float:
    """The penalty weight after an update whose mean KL was ``kl``: x1.5 above 1.3x the target,
    /1.5 below 0.7x, unchanged between."""
    if kl > 1.3 * kl_target:
        return beta * 1.5
    if kl < 0.7 * kl_target:
        return beta / 1.5
    return beta


def value_loss(
    values: torch.Tensor,
    returns: torch.Tensor,
    behaviour_values: torch.Tensor | None = None,
    clip: float | None = None,
) -> torch.Tensor:
    """``0.5 * mean((V - R)^2)``; with ``clip``, the larger of that and the error of ``V`` clipped
    to ``behaviour_values +- clip`` (PPO2's value clipping)."""
    error = (values - returns) ** 2
    if clip is not None:
        if behaviour_values is None:
            raise ValueError("value clipping needs behaviour_values (the values when acting)")
        clipped = behaviour_values + (values - behaviour_values).clamp(-clip, clip)
        error = torch.maximum(error, (clipped - returns) ** 2)
    return 0.5 * error.mean()


def normalize_advantages(advantages: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit standard deviation over the rows given (one row is left unscaled)."""
    if advantages.numel() < 2:
        return advantages - advantages.mean()
    return (advantages - advantages.mean()) / (advantages.std() + eps)
