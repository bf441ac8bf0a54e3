"""Losses of the off-policy actor-critics with twin critics: SAC (Haarnoja et al. 2018, with the
automatic temperature of "Soft Actor-Critic Algorithms and Applications"), TD3 (Fujimoto et al.
2018) and CQL's continuous learner, which is SAC with a penalty. Critics are learned toward the
smaller of two target critics (clipped double Q), which keeps the overestimation a single
critic's maximisation builds up in check.

Every function is pure: tensors in, tensors out; batches are ``[B]`` (values, log-densities)
and ``[B, D]`` (actions in the canonical box ``[-1, 1]^D``).
"""

from __future__ import annotations

import torch


def soft_td_target(
    reward: torch.Tensor,
    discount: torch.Tensor,
    next_q1: torch.Tensor,
    next_q2: torch.Tensor,
    next_log_pi: torch.Tensor | float,
    alpha: torch.Tensor | float,
) -> torch.Tensor:
    """SAC's critic target ``r + gamma * (min(Q1', Q2') - alpha * log pi(a'|s'))`` at an action
    ``a'`` sampled from the current policy at the next state; ``discount`` is 0 where an episode
    ended. ``alpha = 0`` is TD3's target (there ``next_log_pi`` is unused)."""
    return reward + discount * (torch.min(next_q1, next_q2) - alpha * next_log_pi)


def twin_critic_loss(
    q1: torch.Tensor, q2: torch.Tensor, target: torch.Tensor, weight: float = 0.5
) -> torch.Tensor:
    """Both critics' squared errors toward one target: ``weight (Q1 - y)^2 + weight (Q2 - y)^2``,
    averaged over the batch. SAC's reference code (and Stable-Baselines3's SAC) halves them
    (``weight=0.5``); TD3's (and Stable-Baselines3's TD3) sums them (``weight=1``). Adam's step
    would be unchanged by the factor but for its ``eps``: where a weight's gradient is near
    ``eps`` the factor changes its step, and the runs part. From the same start, on the same
    batches, 500 TD3 updates in double precision left weights up to 0.08 apart (the largest
    weight was 0.33)."""
    target = target.detach()
    return weight * ((q1 - target).square().mean() + (q2 - target).square().mean())


def sac_policy_loss(
    value: torch.Tensor, log_pi: torch.Tensor, alpha: torch.Tensor | float
) -> torch.Tensor:
    """``E[alpha * log pi(a|s) - value]`` for reparameterised actions ``a ~ pi(s)``: SAC's policy
    loss with ``value = min(Q1, Q2)(s, a)`` (CQL's first steps fit ``value = log pi(a_data|s)``,
    behaviour cloning, instead). ``alpha`` is a number or a detached tensor: the temperature has
    its own loss."""
    return (alpha * log_pi - value).mean()


def temperature_loss(
    log_alpha: torch.Tensor, log_pi: torch.Tensor, target_entropy: float
) -> torch.Tensor:
    """SAC's automatic temperature: ``-log_alpha * (log pi + target_entropy)``, averaged, whose
    gradient lowers ``alpha`` while the policy's entropy ``-log pi`` is above the target and
    raises it below. Parameterised by ``log_alpha`` so that ``alpha`` stays positive (as
    Stable-Baselines3 and Acme do); ``log_pi`` is detached here."""
    return -(log_alpha * (log_pi.detach() + target_entropy)).mean()


def smoothed_target_action(
    action: torch.Tensor, noise: torch.Tensor, noise_clip: float
) -> torch.Tensor:
    """TD3's target policy smoothing: the target policy's action plus ``noise`` (``sigma *
    N(0, 1)``) clipped to ``[-noise_clip, noise_clip]``, the sum clipped to the box. A critic
    target averaged over nearby actions cannot exploit a narrow peak of the critic."""
    return (action + noise.clamp(-noise_clip, noise_clip)).clamp(-1.0, 1.0)
