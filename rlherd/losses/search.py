"""The losses of search agents (MCTS): Acme's ``AZLearner`` and ``MLPModel``, as pure functions."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def value_td_loss(
    value: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor, next_value: torch.Tensor
) -> torch.Tensor:
    """``[B]`` squared TD errors of ``value`` against ``reward + discount * next_value`` (the
    n-step return of replayed transitions; ``discount`` is 0 at termination). No gradient flows
    into the target; Acme's learner has no target network."""
    target = reward + discount * next_value.detach()
    return (target - value) ** 2


def search_policy_kl(logits: torch.Tensor, search_policy: torch.Tensor) -> torch.Tensor:
    """``[B]`` KL(pi_search || pi_theta): the policy distils the search's visit distribution.

    The Acme paper writes the other direction (its equation 20, KL(pi_theta || pi_MCTS)), which
    is infinite wherever the search never visited an action the policy allows; its code, like
    AlphaZero, minimises this one (the cross-entropy to the search policy, whose gradient this
    shares: the two differ by the search policy's entropy)."""
    log_pi = F.log_softmax(logits, -1)
    log_search = torch.log(torch.where(search_policy > 0, search_policy, 1.0))
    return (search_policy * (log_search - log_pi)).sum(-1)


def transition_model_loss(
    predicted: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    next_obs: torch.Tensor,
    reward: torch.Tensor,
    continues: torch.Tensor,
) -> torch.Tensor:
    """Acme's ``MLPModel`` loss: the mean squared errors of the predicted next observation and
    reward, plus the binary cross-entropy of the continuation logit (``continues``: 1 where the
    episode went on)."""
    next_obs_hat, reward_hat, continue_logit = predicted
    return (
        F.mse_loss(next_obs_hat, next_obs.float())
        + F.mse_loss(reward_hat, reward)
        + F.binary_cross_entropy_with_logits(continue_logit, continues.float())
    )
