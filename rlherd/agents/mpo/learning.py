"""The MPO / DMPO learner (Abdolmaleki et al. 2018; Acme's MPO and DMPO agents).

Each step samples ``num_samples`` actions from the target policy at the batch's next
observations and values them with the target critic once; those values serve twice:

- the critic's target: their mean (MPO: ``r + d * mean_s Q'(s', a_s)``, squared TD error), or
  the mixture of their distributions projected onto the atoms (DMPO, a categorical critic as
  D4PG's);
- the policy's E-step weights: MPO's loss (:func:`rlherd.losses.mpo.gaussian_mpo_loss`) at those
  same states, as Acme's TF MPO learner does (its JAX one uses both observations of a
  transition, for twice the critic evaluations, the cost that dominates a step on a CPU).

Next observations include episodes' final ones, where the critic never learned what an action
does. D4PG's learner avoids them because DPG follows the critic's gradient wherever it points;
here the critic only reweighs samples near the target policy, and the fit is held within KL
bounds of it, so a poorly informed critic at a few states can move the policy only a little.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch

from rlherd import types as F
from rlherd.agents.learning import (
    NetworkLearner,
    SupportPlacer,
    adam,
    clip_grad_norm,
    copy_parameters,
)
from rlherd.agents.mpo.config import MPOConfig
from rlherd.losses.distributional import categorical_cross_entropy, categorical_mean
from rlherd.losses.mpo import MIN_RAW_MULTIPLIER, MPOBounds, gaussian_mpo_loss
from rlherd.networks.continuous import ActorCritic
from rlherd.replay import ReplaySample


class MPOLearner(NetworkLearner):
    """One ``step()``: one batch, one update of critic, policy and Lagrange multipliers, and a
    hard copy into the target networks every ``target_update_period`` steps."""

    checkpointed = ("net", "target", "duals", "policy_optimizer", "critic_optimizer",
                    "dual_optimizer", "support")  # fmt: skip

    def __init__(self, net: ActorCritic, config: MPOConfig, dataset: Iterator[ReplaySample]):
        self.net, self.config, self.dataset = net, config, dataset
        self.target = copy.deepcopy(net)
        self.target.requires_grad_(False)
        c = config
        action_dim = int(net.action_low.numel())
        per_dim = (action_dim,) if c.per_dim_constraining else ()
        device = net.action_low.device
        raw = dict(temperature=((), c.init_log_temperature),
                   alpha_mean=(per_dim, c.init_log_alpha_mean),
                   alpha_stddev=(per_dim, c.init_log_alpha_stddev),
                   penalty_temperature=((), c.init_log_temperature))  # fmt: skip
        self.duals = {k: torch.full(shape, value, device=device, requires_grad=True)
                      for k, (shape, value) in raw.items()}  # fmt: skip
        self.bounds = MPOBounds(c.epsilon, c.epsilon_mean, c.epsilon_stddev, c.epsilon_penalty,
                                c.per_dim_constraining)  # fmt: skip
        self.policy_params = list(net.policy.parameters())
        self.critic_params = list(net.critic.parameters())
        self.policy_optimizer = adam(self.policy_params, c.learning_rate)
        critic_lr = c.learning_rate if c.critic_learning_rate is None else c.critic_learning_rate
        self.critic_optimizer = adam(self.critic_params, critic_lr)
        self.dual_optimizer = adam(list(self.duals.values()), c.dual_learning_rate)
        self.support = SupportPlacer(c, (net.critic, self.target.critic))
        self.num_steps = 0

    def target_samples(self, next_obs: torch.Tensor):
        """Target-policy samples at ``next_obs`` ``[S, B, D]``, the target policy's Gaussian,
        and the target critic's output for each sample (values ``[S, B]`` or logits)."""
        with torch.no_grad():
            mean, std = self.target.policy(next_obs)
            noise = torch.randn((self.config.num_samples, *mean.shape), device=mean.device)
            actions = mean + std * noise
            obs = F.map_obs(lambda x: x.expand(len(actions), *x.shape), next_obs)
            return actions, mean, std, self.target.critic(obs, actions)

    def critic_loss(self, data, action, sampled_out):
        """The critic's loss, and the target mass overflowing the support (0 for MPO)."""
        out = self.net.critic(F.obs_of(data, "obs"), action)
        if self.config.distributional:
            probs = torch.softmax(sampled_out, -1).mean(0)  # the samples' mixture, [B, N]
            td = categorical_cross_entropy(out, probs, self.net.critic.atoms, data["reward"],
                                           data["discount"])  # fmt: skip
            return td.loss.mean(), td.overflow.mean()
        target = data["reward"] + data["discount"] * sampled_out.mean(0)
        return 0.5 * (target - out).square().mean(), torch.zeros((), device=out.device)

    def learn(self, sample: ReplaySample) -> dict[str, Any]:
        data, c = sample.data, self.config
        self.support.place(data["reward"])
        action = self.net.from_env(data["action"])
        next_obs = F.obs_of(data, "next_obs")
        actions, target_mean, target_std, sampled_out = self.target_samples(next_obs)
        critic_loss, overflow = self.critic_loss(data, action, sampled_out)
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        critic_norm = clip_grad_norm(self.critic_params, c.grad_norm_clip)
        self.critic_optimizer.step()

        q_values = sampled_out
        if c.distributional:
            q_values = categorical_mean(sampled_out, self.target.critic.atoms)
        online_mean, online_std = self.net.policy(next_obs)
        d = self.duals
        mpo = gaussian_mpo_loss(
            online_mean=online_mean, online_std=online_std, target_mean=target_mean,
            target_std=target_std, actions=actions, q_values=q_values,
            raw_temperature=d["temperature"], raw_alpha_mean=d["alpha_mean"],
            raw_alpha_stddev=d["alpha_stddev"], raw_penalty_temperature=d["penalty_temperature"],
            bounds=self.bounds,
        )  # fmt: skip
        self.policy_optimizer.zero_grad()
        self.dual_optimizer.zero_grad()
        mpo.loss.backward()
        policy_norm = clip_grad_norm(self.policy_params, c.grad_norm_clip)
        self.policy_optimizer.step()
        self.dual_optimizer.step()
        with torch.no_grad():  # Acme's floor on the raw multipliers
            for raw in self.duals.values():
                raw.clamp_(min=MIN_RAW_MULTIPLIER)

        self.num_steps += 1
        if self.num_steps % c.target_update_period == 0:
            copy_parameters(self.target, self.net)
        self.support.check(overflow, self.num_steps)
        return dict(critic_loss=critic_loss.detach(), critic_grad_norm=critic_norm,
                    policy_grad_norm=policy_norm, support_overflow=overflow,
                    **mpo.stats)  # fmt: skip
