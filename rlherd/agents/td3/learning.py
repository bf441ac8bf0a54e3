"""TD3's learner (Fujimoto et al. 2018, "Addressing Function Approximation Error in
Actor-Critic Methods"): twin critics learned toward the smaller of two target critics at a
smoothed target action; every ``policy_delay`` critic updates, one deterministic policy
gradient step through the first critic, and the targets move ``tau`` toward the networks.
The delay lets the critics settle before the policy follows them, the paper's third fix."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch

from rlherd import types as F
from rlherd.agents.learning import NetworkLearner, adam, polyak_average
from rlherd.agents.td3.config import TD3Config
from rlherd.losses.actor_critic import smoothed_target_action, soft_td_target, twin_critic_loss
from rlherd.networks.continuous import TD3Networks
from rlherd.replay import ReplaySample


class TD3Learner(NetworkLearner):
    """One ``step()``: one batch and one critic update; on every ``policy_delay``-th, a policy
    update and a Polyak step of all the targets (policy and critics), as the paper's code."""

    checkpointed = ("net", "target_net")

    def __init__(self, net: TD3Networks, config: TD3Config, dataset: Iterator[ReplaySample]):
        self.net, self.config, self.dataset = net, config, dataset
        self.target_net = copy.deepcopy(net)
        self.target_net.requires_grad_(False)
        self.optimizers = dict(
            policy=adam(net.policy.parameters(), config.learning_rate),
            critic=adam([*net.q1.parameters(), *net.q2.parameters()], config.critic_learning_rate),
        )
        self.policy_loss = torch.zeros(())  # the last policy update's (a metric between them)
        self.num_steps = 0

    def learn(self, sample: ReplaySample) -> dict[str, Any]:
        c, net, target = self.config, self.net, self.target_net
        d = sample.data
        obs, next_obs = F.obs_of(d, "obs"), F.obs_of(d, "next_obs")
        action = net.from_env(d["action"])
        with torch.no_grad():
            next_action = target.policy(next_obs)
            noise = c.policy_noise * torch.randn_like(next_action)
            next_action = smoothed_target_action(next_action, noise, c.noise_clip)
            next_q1, next_q2 = target.q1(next_obs, next_action), target.q2(next_obs, next_action)
            q_target = soft_td_target(d["reward"], d["discount"], next_q1, next_q2, 0.0, 0.0)
        q1, q2 = net.q1(obs, action), net.q2(obs, action)
        critic_loss = twin_critic_loss(q1, q2, q_target, weight=1.0)  # summed, as the authors'
        critic = self.optimizers["critic"]
        critic.zero_grad(set_to_none=True)
        critic_loss.backward()
        critic.step()
        self.num_steps += 1
        net.learning.fill_(1.0)  # actors stop warming up (they fetch it with the parameters)
        if self.num_steps % c.policy_delay == 0:
            self.policy_loss = self.update_policy(obs)
        return dict(critic_loss=critic_loss.detach(), policy_loss=self.policy_loss,
                    q_target=q_target.mean())  # fmt: skip

    def update_policy(self, obs) -> torch.Tensor:
        """Maximise ``Q1(s, pi(s))`` (the first critic, as the paper), then move the targets."""
        policy_loss = -self.net.q1(obs, self.net.policy(obs)).mean()
        optimizer = self.optimizers["policy"]
        optimizer.zero_grad(set_to_none=True)
        policy_loss.backward(inputs=list(self.net.policy.parameters()))
        optimizer.step()
        polyak_average(self.target_net.parameters(), self.net.parameters(), self.config.tau)
        return policy_loss.detach()
