"""Generalised advantage estimation (Schulman et al. 2016) in rlherd's rollout layout.

Inputs are ``[T, B]`` transitions and ``values [T + 1, B]`` (the last row bootstraps), with the
same episode handling as :mod:`rlherd.losses.vtrace`: a terminated step has no bootstrap, a
truncated one bootstraps from ``values[t + 1]`` (the final observation's value) but stops the
recursion, and masked rows (autoreset steps, padding) get advantage 0.
"""

from __future__ import annotations

import torch

from rlherd.losses import backward_recursion, check_bootstrap_row


@torch.no_grad()
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    mask: torch.Tensor,
    discount: float = 0.99,
    lambda_: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)``, both ``[T, B]``; ``returns = advantages + values[:-1]``."""
    check_bootstrap_row(rewards, values)
    maskf = mask.to(rewards.dtype)
    bootstrap = discount * (~terminated).to(rewards.dtype)
    traces = discount * lambda_ * (~(terminated | truncated)).to(rewards.dtype) * maskf
    deltas = maskf * (rewards + bootstrap * values[1:] - values[:-1])
    advantages = backward_recursion(deltas, traces)
    return advantages, advantages + values[:-1]
