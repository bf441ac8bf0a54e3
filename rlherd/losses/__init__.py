"""Losses as pure functions of tensors. Each is tested against a naive reference in tests/."""

from __future__ import annotations

import torch


def check_bootstrap_row(rewards: torch.Tensor, values: torch.Tensor) -> None:
    """Rollout losses take ``values [T + 1, B]``: the last row bootstraps."""
    T = rewards.shape[0]
    if values.shape[0] != T + 1:
        raise ValueError(
            f"values must have T + 1 = {T + 1} rows (the last is the bootstrap value), "
            f"got shape {tuple(values.shape)}"
        )


def backward_recursion(deltas: torch.Tensor, traces: torch.Tensor) -> torch.Tensor:
    """``out[t] = deltas[t] + traces[t] * out[t + 1]`` with ``out[T] = 0``, over ``[T, B]``:
    the recursion behind both V-trace and GAE."""
    out = torch.empty_like(deltas)
    acc = torch.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        acc = deltas[t] + traces[t] * acc
        out[t] = acc
    return out
