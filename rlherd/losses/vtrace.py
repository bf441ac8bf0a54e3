"""V-trace off-policy targets (Espeholt et al. 2018, section 4) and the IMPALA loss terms.

Inputs are time-major ``[T, B]`` transitions of a rollout in rlherd's layout (see
:mod:`rlherd.types`): ``values`` has one extra row, ``values[T]`` being the bootstrap value.
Episode boundaries inside a rollout are handled without resetting anything:

- ``terminated[t]``: the discount of transition ``t`` is 0;
- ``truncated[t]``: transition ``t`` bootstraps from ``values[t + 1]`` (the value of the final
  observation) but the trace does not flow from ``t + 1`` back into ``t``;
- ``mask[t]`` false: transition ``t`` is an autoreset step (or padding); it contributes nothing,
  and its target is its own value, so a truncated step before it bootstraps from ``V(obs[t])``.

With all flags false and ``mask`` true this is exactly the paper's V-trace.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from rlherd.losses import backward_recursion, check_bootstrap_row


class VTraceReturns(NamedTuple):
    vs: torch.Tensor  # [T, B] value targets
    pg_advantages: torch.Tensor  # [T, B] advantages for the policy gradient (0 where masked)
    log_rhos: torch.Tensor  # [T, B] log importance ratios, unclipped


@torch.no_grad()
def vtrace_from_log_probs(
    behaviour_log_probs: torch.Tensor,
    target_log_probs: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    mask: torch.Tensor,
    discount: float = 0.99,
    lambda_: float = 1.0,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
) -> VTraceReturns:
    """V-trace targets from log-probabilities of the taken actions. Shapes: ``[T, B]`` except
    ``values`` ``[T + 1, B]``. Flags and mask are bool tensors."""
    check_bootstrap_row(rewards, values)
    log_rhos = target_log_probs - behaviour_log_probs
    rhos = log_rhos.exp()
    clipped_rhos = rhos if clip_rho_threshold is None else rhos.clamp(max=clip_rho_threshold)
    cs = lambda_ * rhos.clamp(max=1.0)
    maskf = mask.to(rewards.dtype)
    discounts = discount * (~terminated).to(rewards.dtype)
    traces = discount * (~(terminated | truncated)).to(rewards.dtype) * cs * maskf
    v_t, v_tp1 = values[:-1], values[1:]
    deltas = maskf * clipped_rhos * (rewards + discounts * v_tp1 - v_t)

    vs = v_t + backward_recursion(deltas, traces)

    vs_tp1 = torch.cat([vs[1:], values[-1:]])
    pg_rhos = rhos if clip_pg_rho_threshold is None else rhos.clamp(max=clip_pg_rho_threshold)
    pg_advantages = maskf * pg_rhos * (rewards + discounts * vs_tp1 - v_t)
    return VTraceReturns(vs, pg_advantages, log_rhos)


def action_log_probs(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``log pi(a | x)`` for categorical logits ``[..., A]`` and integer actions ``[...]``."""
    return F.log_softmax(logits, dim=-1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def vtrace_from_logits(
    behaviour_logits: torch.Tensor,
    target_logits: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    mask: torch.Tensor,
    **kwargs,
) -> VTraceReturns:
    """V-trace targets from categorical logits ``[T, B, A]`` and the actions taken."""
    return vtrace_from_log_probs(
        action_log_probs(behaviour_logits, actions),
        action_log_probs(target_logits, actions),
        rewards,
        values,
        terminated,
        truncated,
        mask,
        **kwargs,
    )


def policy_gradient_loss(
    logits: torch.Tensor, actions: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``-sum log pi(a_t | x_t) * A_t`` over valid rows (TorchBeast sums over time and batch)."""
    return -(action_log_probs(logits, actions) * advantages.detach() * mask).sum()


def baseline_loss(values: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``0.5 * sum (v_s - V(x_s))^2`` over valid rows."""
    return 0.5 * (((targets.detach() - values) ** 2) * mask).sum()


def entropy_loss(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Negative entropy ``sum pi log pi`` over valid rows; minimising it keeps the policy broad."""
    log_pi = F.log_softmax(logits, dim=-1)
    return ((log_pi.exp() * log_pi).sum(-1) * mask).sum()
