"""Categorical distributional critics (C51, Bellemare et al. 2017; D4PG, Barth-Maron et al. 2018)
as pure functions of ``[B, ...]`` tensors.

A categorical critic predicts probabilities over fixed ``atoms`` ``z_1 < ... < z_N`` (evenly
spaced from ``vmin`` to ``vmax``). Its target is the next state's distribution shifted by the
n-step return and shrunk by the bootstrap factor, ``r + d * z_j``, then projected back onto the
atoms (:func:`categorical_projection`); the loss is the cross-entropy between that projection and
the prediction (:func:`categorical_cross_entropy`).

Items come from :class:`rlherd.replay.NStepTransitionAdder`: ``reward`` is already the discounted
n-step return and ``discount`` the factor to bootstrap with, ``gamma ** m`` after ``m`` steps
(a truncated episode still bootstraps) and 0 after a termination (all the mass lands on the
return itself).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def categorical_projection(
    probs: torch.Tensor, atoms: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor
) -> torch.Tensor:
    """Project the distribution of ``reward + discount * Z`` (``Z`` has ``probs [B, N]`` on
    ``atoms [N]``) onto ``atoms``: each shifted atom's mass goes to its two neighbours on the
    grid in proportion to closeness, and mass beyond either end goes to that end (C51's
    projection, Bellemare et al. 2017, algorithm 1). Returns ``[B, N]`` probabilities."""
    vmin, vmax = atoms[0], atoms[-1]
    delta = (vmax - vmin) / (len(atoms) - 1)
    shifted = (reward[:, None] + discount[:, None] * atoms[None, :]).clamp(vmin, vmax)
    position = (shifted - vmin) / delta  # fractional index on the grid, in [0, N - 1]
    lower = position.floor().clamp(max=len(atoms) - 2).long()
    upper_weight = position - lower  # 1 when shifted sits on the top atom
    projected = torch.zeros_like(probs)
    projected.scatter_add_(1, lower, probs * (1 - upper_weight))
    projected.scatter_add_(1, lower + 1, probs * upper_weight)
    return projected


class CategoricalTD(NamedTuple):
    loss: torch.Tensor  # [B] cross-entropies
    overflow: torch.Tensor  # [B] target mass whose shifted atom fell outside [vmin, vmax]


def categorical_cross_entropy(
    logits: torch.Tensor,
    target_probs: torch.Tensor,
    atoms: torch.Tensor,
    reward: torch.Tensor,
    discount: torch.Tensor,
) -> CategoricalTD:
    """D4PG's critic loss: ``-sum_j p_j log softmax(logits)_j`` where ``p`` is the projection of
    ``reward + discount * Z_target`` (``target_probs [B, N]``; no gradient flows into it).

    ``overflow`` is the target mass that the projection had to pile onto an end atom: a support
    ``[vmin, vmax]`` too narrow for the task's returns shows up there first."""
    with torch.no_grad():
        projected = categorical_projection(target_probs, atoms, reward, discount)
        shifted = reward[:, None] + discount[:, None] * atoms[None, :]
        outside = (shifted < atoms[0] - 1e-6) | (shifted > atoms[-1] + 1e-6)
        overflow = (target_probs * outside).sum(-1)
    loss = -(projected * torch.log_softmax(logits, -1)).sum(-1)
    return CategoricalTD(loss, overflow)


def categorical_mean(logits: torch.Tensor, atoms: torch.Tensor) -> torch.Tensor:
    """The expected value ``sum_j softmax(logits)_j z_j`` over the last dimension."""
    return (torch.softmax(logits, -1) * atoms).sum(-1)
