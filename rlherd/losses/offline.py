"""Losses of the agents that learn from a fixed dataset (behaviour cloning, CQL, CRR).

Behaviour cloning fits the dataset's actions by likelihood (Acme's ``bc.logp``) or, for
continuous actions, by squared error of the policy's mean (Acme's ``bc.mse``, here on the mean
rather than a sample, which has the same minimiser and no sampling noise).
"""

from __future__ import annotations

import torch
import torch.nn.functional as nnf


def categorical_nll(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Mean ``-log softmax(logits)[action]`` over the batch: ``logits [B, A]``, ``actions [B]``."""
    return nnf.cross_entropy(logits, actions.long())


def gaussian_nll(mean: torch.Tensor, std: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of ``-log N(action; mean, diag(std^2))``, summed over the ``D``
    action dimensions: ``[B, D]`` each."""
    z = (actions - mean) / std
    log_prob = -0.5 * z.square() - std.log() - 0.5 * torch.log(torch.tensor(2 * torch.pi))
    return -log_prob.sum(-1).mean()


def mean_squared_error(mean: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of ``|action - mean|^2`` (summed over action dimensions)."""
    return (actions - mean).square().sum(-1).mean()


def crr_weights(
    q: torch.Tensor, q_samples: torch.Tensor, weighting: str, beta: float, upper_bound: float
) -> torch.Tensor:
    """CRR's weight of each dataset action (Wang et al. 2020, equations 3 and 4): the advantage
    ``A = Q(s, a) - mean_j Q(s, a_j)`` over the policy's sampled actions ``a_j`` (``q [B]``,
    ``q_samples [K, B]``), then ``min(exp(A / beta), upper_bound)`` (``"exp"``) or the
    indicator ``A > 0`` (``"indicator"``, 0 at A = 0 as Acme's ``heaviside(A, 0)``)."""
    advantage = q - q_samples.mean(0)
    if weighting == "exp":
        return torch.exp(advantage / beta).clamp(max=upper_bound)
    return (advantage > 0).to(q.dtype)


def weighted_likelihood_loss(log_prob: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``-mean(weights * log_prob)``: the policy fits the dataset's actions in proportion to
    their (fixed) weights, as CRR's and AWR's policy steps do."""
    return -(weights.detach() * log_prob).mean()


def cql_gap_discrete(
    q: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """CQL(H)'s gap for discrete actions (Kumar et al. 2020, equation 4): ``logsumexp_a Q(s, a)
    - Q(s, a_data)`` per state (``q [B, A]``, ``actions [B]``), the log-sum-exp over the legal
    actions where a ``mask`` says which. Minimising it pushes down the values of actions the
    dataset does not take, relative to those it does."""
    legal = q if mask is None else q.masked_fill(~mask.bool(), -torch.inf)
    return torch.logsumexp(legal, -1) - q.gather(-1, actions.long()[:, None])[:, 0]


def cql_gap_continuous(
    q_data: torch.Tensor,
    q_random: torch.Tensor,
    q_policy: torch.Tensor,
    log_pi: torch.Tensor,
    q_next_policy: torch.Tensor,
    log_pi_next: torch.Tensor,
    action_dim: int,
) -> torch.Tensor:
    """CQL(H)'s gap for continuous actions, its ``logsumexp_a Q(s, a)`` estimated by importance
    sampling as the CQL authors' code does (appendix F): ``N`` actions uniform on the box
    ``[-1, 1]^D`` (density ``2^-D``) and ``N`` each from the policy at ``s`` and at ``s'``
    (densities ``exp(log_pi)``, ``exp(log_pi_next)``), all valued at ``s``. Shapes: ``q_data
    [B]``, the rest ``[N, B]``; returns ``[B]``."""
    log_uniform = -action_dim * torch.log(torch.tensor(2.0))
    terms = torch.cat([q_random - log_uniform, q_policy - log_pi, q_next_policy - log_pi_next])
    return torch.logsumexp(terms, 0) - q_data


def cql_lagrange_loss(log_alpha: torch.Tensor, gap: torch.Tensor, threshold: float):
    """The Lagrange form of CQL (its equation 30): the coefficient ``alpha = exp(log_alpha)``
    rises while the mean gap exceeds ``threshold`` and falls below it. Returns the critic's
    penalty ``alpha * (gap - threshold)`` (alpha held fixed) and alpha's own loss (the gap held
    fixed), to be minimised by their own optimisers."""
    alpha = log_alpha.exp().clamp(max=1e6)
    excess = gap.mean() - threshold
    return alpha.detach() * excess, -alpha * excess.detach()
