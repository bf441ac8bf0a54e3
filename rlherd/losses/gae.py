"""Generalised advantage estimation (Schulman et al. 2016) in rlherd's rollout layout.

Inputs are ``[T, B]`` transitions and ``values [T + 1, B]`` (the last row bootstraps), with the
same episode handling as :mod:`rlherd.losses.vtrace`: a terminated step has no bootstrap, a
truncated one bootstraps from ``values[t + 1]`` (the final observation's value) but stops the
recursion, and masked rows (autoreset steps, padding) get advantage 0.
"""

from __future__ import annotations

import torch


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
    T = rewards.shape[0]
    if values.shape[0] != T + 1:
        raise ValueError(
            f"values must have T + 1 = {T + 1} rows (the last is the bootstrap value), "
            f"got shape {tuple(values.shape)}"
        )
    maskf = mask.to(rewards.dtype)
    bootstrap = discount * (~terminated).to(rewards.dtype)
    traces = discount * lambda_ * (~(terminated | truncated)).to(rewards.dtype) * maskf
    deltas = maskf * (rewards + bootstrap * values[1:] - values[:-1])
    advantages = torch.empty_like(rewards)
    acc = torch.zeros_like(values[-1])
    for t in range(T - 1, -1, -1):
        acc = deltas[t] + traces[t] * acc
        advantages[t] = acc
    return advantages, advantages + values[:-1]
