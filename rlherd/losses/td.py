"""Temporal-difference errors for value-based agents, as pure functions of ``[B, ...]`` tensors.

Targets are built from n-step items (:class:`rlherd.replay.NStepTransitionAdder`): ``reward`` is
already the discounted n-step return and ``discount`` the factor to bootstrap with (0 after a
termination), so one-step and n-step learning share these functions.
"""

from __future__ import annotations

import torch


def huber(x: torch.Tensor, delta: float = 1.0) -> torch.Tensor:
    """Quadratic within ``[-delta, delta]``, linear outside: ``0.5 x^2`` or
    ``delta (|x| - delta / 2)``. PyTorch's fused kernel: one call forward and one backward
    where the formula written out takes seven each."""
    return torch.nn.functional.huber_loss(x, torch.zeros_like(x), reduction="none", delta=delta)


def greedy_action(q: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``argmax_a q(a)`` over the last dimension, among the legal actions (``mask`` true or 1)
    where a mask is given; a row with no legal action (a game's end) takes action 0."""
    if mask is not None:
        q = q.masked_fill(~mask.bool(), -torch.inf)
    return q.argmax(-1)


def q_learning_td(
    q_tm1: torch.Tensor,
    a_tm1: torch.Tensor,
    reward: torch.Tensor,
    discount: torch.Tensor,
    q_t: torch.Tensor,
    mask_t: torch.Tensor | None = None,
) -> torch.Tensor:
    """``r + d * max_a q_t(a) - q_tm1(a_tm1)``, the max over the actions legal at the next state
    (``mask_t``, where given); the target carries no gradient."""
    if mask_t is None:
        best = q_t.max(-1).values
    else:
        best = q_t.gather(-1, greedy_action(q_t, mask_t)[:, None])[:, 0]
    target = reward + discount * best
    return target.detach() - q_tm1.gather(-1, a_tm1.long()[:, None])[:, 0]


def double_q_learning_td(
    q_tm1: torch.Tensor,
    a_tm1: torch.Tensor,
    reward: torch.Tensor,
    discount: torch.Tensor,
    q_t_value: torch.Tensor,
    q_t_selector: torch.Tensor,
    mask_t: torch.Tensor | None = None,
) -> torch.Tensor:
    """Double Q-learning (van Hasselt et al. 2016): the online network selects the next action
    (among the legal ones, ``mask_t``), the target network values it:
    ``r + d * q_t_value(argmax q_t_selector) - q_tm1(a_tm1)``."""
    best = greedy_action(q_t_selector, mask_t)[:, None]
    target = reward + discount * q_t_value.gather(-1, best)[:, 0]
    return target.detach() - q_tm1.gather(-1, a_tm1.long()[:, None])[:, 0]


def signed_hyperbolic(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """R2D2's value rescaling ``h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x``."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1) - 1) + eps * x


def signed_parabolic(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """The inverse of :func:`signed_hyperbolic`."""
    z = torch.sqrt(1 + 4 * eps * (eps + 1 + x.abs())) / 2 / eps - 1 / 2 / eps
    return torch.sign(x) * (z**2 - 1)


def transformed_double_q_td(
    q_tm1: torch.Tensor,
    a_tm1: torch.Tensor,
    reward: torch.Tensor,
    discount: torch.Tensor,
    q_t_value: torch.Tensor,
    q_t_selector: torch.Tensor,
    eps: float = 1e-3,
) -> torch.Tensor:
    """Double Q-learning with the transformed Bellman operator (Pohlen et al. 2018): values live
    in ``h``-space; the target is ``h(r + d * h^-1(q_t_value(argmax q_t_selector)))``."""
    best = q_t_selector.argmax(-1, keepdim=True)
    bootstrap = signed_parabolic(q_t_value.gather(-1, best)[:, 0], eps)
    target = signed_hyperbolic(reward + discount * bootstrap, eps)
    return target.detach() - q_tm1.gather(-1, a_tm1.long()[:, None])[:, 0]


def n_step_sequence_returns(
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    ends: torch.Tensor,
    values: torch.Tensor,
    n: int,
) -> torch.Tensor:
    """n-step returns along ``[T, B]`` sequences of rows (R2D2's targets): for row ``t``,
    ``r_t + d_t r_{t+1} + ... + (d_t ... d_{t+m-1}) v_{t+m}`` with ``m = n``, or fewer where the
    episode ends first (``ends[t]``: the step from row ``t`` was its last) or the sequence does.

    ``discounts[t]`` is the discount after row ``t``'s step (0 where it terminated); ``values``
    are the bootstrap values of each row's observation. A window stops after an ended row and
    bootstraps from the next row's value (0 after a termination, through the discount; the
    final observation's value after a truncation). The last row has no step after it in the
    sequence, so its "return" is its own value. Built as ``n`` rounds of one-step backups:
    ``G^k_t = r_t + d_t (ends_t ? v_{t+1} : G^{k-1}_{t+1})``, ``G^0 = v``."""
    returns = values
    for _ in range(n):
        following = torch.where(ends[:-1], values[1:], returns[1:])
        returns = torch.cat([rewards[:-1] + discounts[:-1] * following, values[-1:]])
    return returns


def sequence_priorities(
    td_abs: torch.Tensor, valid: torch.Tensor, max_weight: float = 0.9
) -> torch.Tensor:
    """R2D2's priority of each ``[T, B]`` sequence: ``w max_t |td| + (1 - w) mean_t |td|``
    over its ``valid`` rows (0 for a sequence with none)."""
    td_abs = td_abs * valid
    count = valid.sum(0).clamp(min=1)
    return max_weight * td_abs.max(0).values + (1 - max_weight) * td_abs.sum(0) / count


def large_margin(
    q: torch.Tensor, action: torch.Tensor, margin: float = 0.8, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """DQfD's supervised loss on a demonstrated action (Hester et al. 2018, equation 2):
    ``max_a [q(a) + l(a)] - q(a_E)`` with ``l = margin`` except 0 at the demonstrated ``a_E``;
    zero once ``a_E`` leads every other legal action (``mask``, where given) by ``margin``.
    ``q [B, A]``, ``action [B]``."""
    action = action.long()[:, None]
    bonus = torch.full_like(q, margin).scatter(-1, action, 0.0)
    scores = q + bonus
    if mask is not None:  # the demonstrated action counts as legal whatever the mask says
        legal = mask.bool().scatter(-1, action, True)
        scores = scores.masked_fill(~legal, -torch.inf)
    return scores.max(-1).values - q.gather(-1, action)[:, 0]
