"""CRR's learner (Wang et al. 2020, "Critic Regularized Regression"): a critic learned by TD
with target networks, and a policy that fits the dataset's actions weighted by how much better
than the policy's own they are (:func:`rlherd.losses.offline.crr_weights`)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch

from rlherd import types as F
from rlherd.agents.crr.config import CRRConfig
from rlherd.agents.learning import NetworkLearner, adam, copy_parameters
from rlherd.losses.offline import crr_weights, weighted_likelihood_loss
from rlherd.networks.continuous import ActorCritic
from rlherd.replay.dataset import ReplaySample


def sample_actions(mean: torch.Tensor, std: torch.Tensor, k: int | None = None) -> torch.Tensor:
    """Gaussian samples clipped to the canonical box: ``[B, D]``, or ``[k, B, D]``."""
    shape = mean.shape if k is None else (k, *mean.shape)
    return (mean + std * torch.randn(shape, device=mean.device)).clamp(-1.0, 1.0)


class CRRLearner(NetworkLearner):
    checkpointed = ("net", "target_net", "optimizer")

    def __init__(self, net: ActorCritic, config: CRRConfig, dataset: Iterator[ReplaySample]):
        self.net, self.config, self.dataset = net, config, dataset
        self.target_net = copy.deepcopy(net)
        self.target_net.requires_grad_(False)
        self.optimizer = adam(net.parameters(), config.learning_rate)
        self.num_steps = 0

    def learn(self, sample: ReplaySample) -> dict[str, Any]:
        c, net = self.config, self.net
        d = sample.data
        obs, next_obs = F.obs_of(d, "obs"), F.obs_of(d, "next_obs")
        action = net.from_env(d["action"])
        with torch.no_grad():  # the critic's target: the target policy's action at next_obs
            next_action = sample_actions(*self.target_net.policy(next_obs))
            target = d["reward"] + d["discount"] * self.target_net.critic(next_obs, next_action)
        q = net.critic(obs, action)
        critic_loss = 0.5 * (q - target).square().mean()
        mean, std = net.policy(obs)
        with torch.no_grad():  # the weights: the dataset action's advantage over the policy's
            samples = sample_actions(mean, std, c.num_action_samples)
            expanded = F.map_obs(lambda x: x.expand(c.num_action_samples, *x.shape), obs)
            q_samples = net.critic(expanded, samples)
            weights = crr_weights(q.detach(), q_samples, c.weighting, c.beta, c.ratio_upper_bound)
        log_prob = torch.distributions.Normal(mean, std).log_prob(action).sum(-1)
        policy_loss = weighted_likelihood_loss(log_prob, weights)
        self.optimizer.zero_grad(set_to_none=True)
        (critic_loss + policy_loss).backward()  # disjoint parameters: one Adam serves both
        self.optimizer.step()
        self.num_steps += 1
        if self.num_steps % c.target_update_period == 0:
            copy_parameters(self.target_net, net)
        return dict(critic_loss=critic_loss.detach(), policy_loss=policy_loss.detach(),
                    weight_mean=weights.mean(), q_mean=q.detach().mean(),
                    total_loss=(critic_loss + policy_loss).detach())  # fmt: skip
