"""The D4PG / DDPG learner: a critic learned from n-step transitions against target networks, and
a deterministic policy improved along the critic's action gradient (DPG, Silver et al. 2014).

D4PG's critic is categorical (Barth-Maron et al. 2018): its target is the target critic's
distribution at the target policy's next action, shifted by the n-step return and projected onto
the atoms (:mod:`rlherd.losses.distributional`). DDPG's is one value, learned by squared TD error.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch

from rlherd import types as F
from rlherd.agents.d4pg.config import D4PGConfig
from rlherd.agents.learning import (
    NetworkLearner,
    SupportPlacer,
    adam,
    clip_grad_norm,
    copy_parameters,
)
from rlherd.losses.distributional import categorical_cross_entropy, categorical_mean
from rlherd.networks.continuous import ActorCritic, Critic
from rlherd.replay import ReplaySample


def critic_value(critic: Critic, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """``Q(obs, action)``: the value, or the categorical distribution's mean."""
    out = critic(obs, action)
    return categorical_mean(out, critic.atoms) if critic.num_atoms > 1 else out


def dpg_loss(action: torch.Tensor, dqda: torch.Tensor, clip: float | None) -> torch.Tensor:
    """Deterministic policy gradient as a loss (Acme's TF ``losses.dpg`` with
    ``clip_norm=True``): ``0.5 ||a - sg(a + dq/da)||^2`` summed over the action and averaged over
    the batch, whose gradient with respect to ``a`` is ``-dq/da``; ``dq/da`` is first clipped to
    norm ``clip`` per sample."""
    if clip is not None:
        norm = dqda.norm(dim=-1, keepdim=True)
        dqda = dqda * (clip / norm.clamp_min(clip))
    target = (action + dqda).detach()
    return 0.5 * (target - action).square().sum(-1).mean()


class D4PGLearner(NetworkLearner):
    """One ``step()``: one batch, one critic update, one policy update, and a hard copy into the
    target networks every ``target_update_period`` steps (Acme's D4PG learner)."""

    checkpointed = ("net", "target", "policy_optimizer", "critic_optimizer", "support")

    def __init__(self, net: ActorCritic, config: D4PGConfig, dataset: Iterator[ReplaySample]):
        self.net, self.config, self.dataset = net, config, dataset
        self.target = copy.deepcopy(net)
        self.target.requires_grad_(False)
        self.policy_params = list(net.policy.parameters())
        self.critic_params = list(net.critic.parameters())
        self.policy_optimizer = adam(self.policy_params, config.learning_rate)
        critic_lr = config.critic_learning_rate
        critic_lr = config.learning_rate if critic_lr is None else critic_lr
        self.critic_optimizer = adam(self.critic_params, critic_lr)
        self.support = SupportPlacer(config, (net.critic, self.target.critic))
        self.num_steps = 0

    def critic_loss(self, data: dict[str, torch.Tensor], action: torch.Tensor):
        """The critic's loss, and the target mass overflowing the support (0 for DDPG)."""
        with torch.no_grad():
            next_obs = F.obs_of(data, "next_obs")
            next_action = self.target.policy(next_obs)
            target_out = self.target.critic(next_obs, next_action)
        out = self.net.critic(F.obs_of(data, "obs"), action)
        if self.config.distributional:
            atoms = self.net.critic.atoms
            td = categorical_cross_entropy(out, torch.softmax(target_out, -1), atoms,
                                           data["reward"], data["discount"])  # fmt: skip
            return td.loss.mean(), td.overflow.mean()
        target = data["reward"] + data["discount"] * target_out
        return 0.5 * (target - out).square().mean(), torch.zeros((), device=out.device)

    def policy_loss(self, obs: torch.Tensor) -> torch.Tensor:
        """DPG at ``obs`` through the online critic; only the policy's parameters get gradients.
        ``obs`` are the states the batch's actions were taken in. (Acme uses the next
        observations, which include episodes' final ones, where the critic never learned what
        an action does.)"""
        action = self.net.policy(obs)
        q = critic_value(self.net.critic, obs, action)
        (dqda,) = torch.autograd.grad(q.sum(), action)
        return dpg_loss(action, dqda, self.config.dqda_clip)

    def learn(self, sample: ReplaySample) -> dict[str, Any]:
        data, c = sample.data, self.config
        self.support.place(data["reward"])
        action = self.net.from_env(data["action"])
        critic_loss, overflow = self.critic_loss(data, action)
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        critic_norm = clip_grad_norm(self.critic_params, c.grad_norm_clip)
        self.critic_optimizer.step()

        policy_loss = self.policy_loss(F.obs_of(data, "obs"))
        self.policy_optimizer.zero_grad()
        policy_loss.backward()
        policy_norm = clip_grad_norm(self.policy_params, c.grad_norm_clip)
        self.policy_optimizer.step()

        self.num_steps += 1
        if self.num_steps % c.target_update_period == 0:
            copy_parameters(self.target, self.net)
        self.support.check(overflow, self.num_steps)
        return dict(critic_loss=critic_loss.detach(), policy_loss=policy_loss.detach(),
                    critic_grad_norm=critic_norm, policy_grad_norm=policy_norm,
                    support_overflow=overflow)  # fmt: skip
