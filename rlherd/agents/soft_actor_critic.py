"""SAC's learner (Haarnoja et al. 2018), which two agents share: SAC's (``rlherd/agents/sac``)
and CQL's for continuous actions (``rlherd/agents/cql``), so it lives here, outside both folders.

Twin critics learned toward the smaller of their Polyak-averaged targets at the policy's next
action, less the temperature times its log-density; a tanh-Gaussian policy that maximises the
smaller critic plus its entropy; a temperature tuned toward a target entropy
(:mod:`rlherd.losses.actor_critic`).

CQL's continuous learner is this one with a penalty on the critics and a policy that clones the
dataset first: it overrides :meth:`SACLearner.critic_penalty` and :meth:`SACLearner.policy_value`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from rlherd import types as F
from rlherd.agents.learning import NetworkLearner, adam, polyak_average
from rlherd.losses.actor_critic import (
    sac_policy_loss,
    soft_td_target,
    temperature_loss,
    twin_critic_loss,
)
from rlherd.networks.continuous import SACNetworks, tanh_gaussian_sample
from rlherd.replay import ReplaySample


class SACLearner(NetworkLearner):
    """One ``step()``: one batch; the critics' loss (and any penalty), the policy's and the
    temperature's, each through its own Adam, from one forward pass; then the target critics
    move ``tau`` of the way toward the critics. All three gradients are taken at the parameters
    as they were, as Acme's SAC takes them; Stable-Baselines3's steps the critics before the
    policy's loss reads them (docs/agents/sac.md says what else differs, and by how much).

    The policy's loss runs through the critics, but only the policy's parameters take its
    gradient (``backward(inputs=...)``), so the critics learn from their own loss alone.
    ``duals`` are further scalars (CQL's Lagrange multiplier) that share the temperature's
    optimiser."""

    checkpointed = ("net", "target_net", "log_entropy")

    def __init__(
        self,
        net: SACNetworks,
        config: Any,
        dataset: Iterator[ReplaySample],
        duals: Sequence[torch.Tensor] = (),
    ):
        self.net, self.config, self.dataset = net, config, dataset
        self.target_net = copy.deepcopy(net)
        self.target_net.requires_grad_(False)
        self.device = next(net.parameters()).device
        # log alpha: the temperature starts at 1 (Stable-Baselines3's "auto", Acme's).
        self.log_entropy = torch.zeros((), device=self.device, requires_grad=True)
        target = config.target_entropy
        self.target_entropy = -float(net.action_low.numel()) if target is None else target
        self.optimizers = dict(
            policy=adam(net.policy.parameters(), config.policy_learning_rate),
            critic=adam([*net.q1.parameters(), *net.q2.parameters()], config.critic_learning_rate),
            duals=adam([*duals, self.log_entropy], config.critic_learning_rate),
        )
        self.num_steps = 0

    def entropy_coefficient(self) -> torch.Tensor:
        """alpha in use: the config's, or the tuned one."""
        fixed = self.config.entropy_coefficient
        if fixed is None:
            return self.log_entropy.detach().exp()
        return torch.tensor(fixed, device=self.device)

    def critic_penalty(
        self, obs, next_obs, action: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A loss added to the critics' (and its duals'), and its metrics: none for SAC."""
        return torch.zeros((), device=self.device), {}

    def policy_value(self, obs, action, mean, log_std, data_action) -> torch.Tensor:
        """What the policy maximises at its reparameterised ``action`` (drawn from ``mean`` and
        ``log_std``; ``data_action`` is the batch's): the smaller critic."""
        return torch.min(self.net.q1(obs, action), self.net.q2(obs, action))

    def learn(self, sample: ReplaySample) -> dict[str, Any]:
        c, net, target = self.config, self.net, self.target_net
        d = sample.data
        obs, next_obs = F.obs_of(d, "obs"), F.obs_of(d, "next_obs")
        action = net.from_env(d["action"])
        alpha = self.entropy_coefficient()
        with torch.no_grad():
            next_action, next_log_pi = tanh_gaussian_sample(*net.policy(next_obs))
            next_q1, next_q2 = target.q1(next_obs, next_action), target.q2(next_obs, next_action)
            q_target = soft_td_target(d["reward"], d["discount"], next_q1, next_q2, next_log_pi,
                                      alpha)  # fmt: skip
        critic_loss = twin_critic_loss(net.q1(obs, action), net.q2(obs, action), q_target)
        penalty, metrics = self.critic_penalty(obs, next_obs, action)

        mean, log_std = net.policy(obs)
        new_action, log_pi = tanh_gaussian_sample(mean, log_std)
        value = self.policy_value(obs, new_action, mean, log_std, action)
        policy_loss = sac_policy_loss(value, log_pi, alpha)
        entropy_loss = torch.zeros((), device=self.device)
        if c.entropy_coefficient is None:
            entropy_loss = temperature_loss(self.log_entropy, log_pi, self.target_entropy)

        for o in self.optimizers.values():
            o.zero_grad(set_to_none=True)
        (critic_loss + penalty + entropy_loss).backward()
        policy_loss.backward(inputs=list(net.policy.parameters()))
        for o in self.optimizers.values():
            o.step()
        self.num_steps += 1
        net.learning.fill_(1.0)  # actors stop warming up (they fetch it with the parameters)
        polyak_average([*target.q1.parameters(), *target.q2.parameters()],
                       [*net.q1.parameters(), *net.q2.parameters()], c.tau)
        total = (critic_loss + penalty + policy_loss).detach()
        return dict(critic_loss=critic_loss.detach(), policy_loss=policy_loss.detach(),
                    entropy_coefficient=alpha, log_pi=log_pi.detach().mean(),
                    q_target=q_target.mean(), total_loss=total, **metrics)  # fmt: skip
