"""CQL's learners (Kumar et al. 2020, "Conservative Q-Learning for Offline RL"): Q-learning
whose values of actions the dataset does not take are pushed down by the CQL(H) penalty
(:mod:`rlherd.losses.offline`), with a fixed coefficient or its Lagrange form.

- :class:`DiscreteCQLLearner`: double Q-learning with n-step targets and a target network.
- :class:`ContinuousCQLLearner`: a SAC-style actor-critic (twin critics, Polyak targets, an
  entropy term fixed or tuned); the policy clones the dataset for ``num_bc_iters`` steps, then
  maximises the smaller critic.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch

from rlherd import types as F
from rlherd.agents.cql.config import CQLConfig
from rlherd.agents.cql.networks import DiscreteQ
from rlherd.agents.learning import NetworkLearner, adam, copy_parameters
from rlherd.losses.offline import cql_gap_continuous, cql_gap_discrete, cql_lagrange_loss
from rlherd.losses.td import double_q_learning_td, huber
from rlherd.networks.continuous import SACNetworks, tanh_gaussian_log_prob, tanh_gaussian_sample
from rlherd.replay.dataset import ReplaySample


class _CQLLearner(NetworkLearner):
    """What both learners share: the target network, the conservative coefficient (a number, or
    ``log_alpha`` with its own Adam), and checkpoints of all their tensors and optimisers."""

    checkpointed = ("net", "target_net", "log_alpha")
    optimizers: dict[str, torch.optim.Optimizer]

    def __init__(self, net: torch.nn.Module, config: CQLConfig, dataset: Iterator[ReplaySample]):
        self.net, self.config, self.dataset = net, config, dataset
        self.target_net = copy.deepcopy(net)
        self.target_net.requires_grad_(False)
        self.device = next(net.parameters()).device
        # CQL-Lagrange's coefficient, exp(log_alpha).
        self.log_alpha = torch.zeros((), device=self.device, requires_grad=True)
        self.num_steps = 0

    def coefficient(self) -> torch.Tensor:
        """The conservative coefficient in use (a metric)."""
        fixed = self.config.cql_coefficient
        return self.log_alpha.detach().exp() if fixed is None else torch.tensor(fixed)

    def penalty(self, gap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The critic's conservative penalty for per-state ``gap`` s, and the coefficient's own
        loss (zero when it is fixed)."""
        c = self.config
        if c.cql_coefficient is not None:
            return c.cql_coefficient * gap.mean(), gap.new_zeros(())
        return cql_lagrange_loss(self.log_alpha, gap, c.cql_lagrange_threshold)

    def checkpoint_parts(self) -> dict[str, Any]:
        """The optimisers, kept in one dict (``learn`` steps them all), each under a key of its
        own, ``optimizer/<name>``."""
        return dict(super().checkpoint_parts(),
                    **{f"optimizer/{k}": o for k, o in self.optimizers.items()})  # fmt: skip


class DiscreteCQLLearner(_CQLLearner):
    def __init__(self, net: DiscreteQ, config: CQLConfig, dataset: Iterator[ReplaySample]):
        super().__init__(net, config, dataset)
        self.optimizers = dict(q=adam(net.parameters(), config.learning_rate),
                               alpha=adam([self.log_alpha], config.learning_rate))  # fmt: skip

    def learn(self, sample: ReplaySample) -> dict[str, Any]:
        d = sample.data
        obs, next_obs = F.obs_of(d, "obs"), F.obs_of(d, "next_obs")
        q = self.net(obs)
        with torch.no_grad():
            q_next, q_next_target = self.net(next_obs), self.target_net(next_obs)
        td = double_q_learning_td(q, d["action"], d["reward"], d["discount"], q_next_target,
                                  q_next, F.action_mask(next_obs))  # fmt: skip
        gap = cql_gap_discrete(q, d["action"], F.action_mask(obs))
        penalty, alpha_loss = self.penalty(gap)
        td_loss = huber(td).mean()
        for o in self.optimizers.values():
            o.zero_grad(set_to_none=True)
        (td_loss + penalty + alpha_loss).backward()
        for o in self.optimizers.values():
            o.step()
        self.num_steps += 1
        if self.num_steps % self.config.target_update_period == 0:
            copy_parameters(self.target_net, self.net)
        return dict(td_loss=td_loss.detach(), cql_gap=gap.detach().mean(),
                    cql_coefficient=self.coefficient(),
                    total_loss=(td_loss + penalty).detach())  # fmt: skip


class ContinuousCQLLearner(_CQLLearner):
    checkpointed = (*_CQLLearner.checkpointed, "log_entropy")

    def __init__(self, net: SACNetworks, config: CQLConfig, dataset: Iterator[ReplaySample]):
        super().__init__(net, config, dataset)
        self.critics = [*net.q1.parameters(), *net.q2.parameters()]
        self.log_entropy = torch.zeros((), device=self.device, requires_grad=True)
        self.target_entropy = config.target_entropy
        if self.target_entropy is None:
            self.target_entropy = -float(net.action_low.numel())
        self.optimizers = dict(
            policy=adam(net.policy.parameters(), config.policy_learning_rate),
            critic=adam(self.critics, config.critic_learning_rate),
            duals=adam([self.log_alpha, self.log_entropy], config.critic_learning_rate),
        )

    def entropy_coefficient(self) -> torch.Tensor:
        fixed = self.config.entropy_coefficient
        return self.log_entropy.exp() if fixed is None else torch.tensor(fixed, device=self.device)

    def learn(self, sample: ReplaySample) -> dict[str, Any]:
        c, net, target = self.config, self.net, self.target_net
        d = sample.data
        obs, next_obs = F.obs_of(d, "obs"), F.obs_of(d, "next_obs")
        action = net.from_env(d["action"])
        entropy = self.entropy_coefficient().detach()
        n = c.cql_num_samples
        with torch.no_grad():
            next_action, next_log_pi = tanh_gaussian_sample(*net.policy(next_obs))
            next_q = torch.min(target.q1(next_obs, next_action), target.q2(next_obs, next_action))
            q_target = d["reward"] + d["discount"] * (next_q - entropy * next_log_pi)
            # Actions whose values the penalty pushes down, all valued at obs.
            uniform = torch.rand(n, *action.shape, device=action.device) * 2.0 - 1.0
            at_obs, log_pi = tanh_gaussian_sample(*net.policy(obs), n)
            at_next, log_pi_next = tanh_gaussian_sample(*net.policy(next_obs), n)
        obs_n = F.map_obs(lambda x: x.expand(n, *x.shape), obs)
        td_loss, penalty, alpha_loss, gaps = 0.0, 0.0, 0.0, []
        for critic in (net.q1, net.q2):
            q = critic(obs, action)
            td_loss = td_loss + 0.5 * (q - q_target).square().mean()
            gap = cql_gap_continuous(q, critic(obs_n, uniform), critic(obs_n, at_obs), log_pi,
                                     critic(obs_n, at_next), log_pi_next,
                                     action.shape[-1])  # fmt: skip
            critic_penalty, critic_alpha_loss = self.penalty(gap)
            penalty, alpha_loss = penalty + critic_penalty, alpha_loss + critic_alpha_loss / 2
            gaps.append(gap.detach().mean())
        # The policy: clone the dataset first, then maximise the smaller critic.
        mean, log_std = net.policy(obs)
        new_action, new_log_pi = tanh_gaussian_sample(mean, log_std)
        if self.num_steps < c.num_bc_iters:
            fit = tanh_gaussian_log_prob(mean, log_std, action)
        else:
            fit = torch.min(net.q1(obs, new_action), net.q2(obs, new_action))
        policy_loss = (entropy * new_log_pi - fit).mean()
        entropy_loss = policy_loss.new_zeros(())
        if c.entropy_coefficient is None:
            entropy_loss = -(self.log_entropy * (new_log_pi.detach() + self.target_entropy)).mean()
        for o in self.optimizers.values():
            o.zero_grad(set_to_none=True)
        (td_loss + penalty + alpha_loss + entropy_loss).backward()
        # The policy's loss runs through the critics, whose gradients are their own losses'.
        policy_loss.backward(inputs=list(net.policy.parameters()))
        for o in self.optimizers.values():
            o.step()
        self.num_steps += 1
        with torch.no_grad():
            torch._foreach_lerp_(list(target.parameters()), list(net.parameters()), c.tau)
        return dict(critic_loss=td_loss.detach(), policy_loss=policy_loss.detach(),
                    cql_gap=torch.stack(gaps).mean(), cql_coefficient=self.coefficient(),
                    entropy_coefficient=entropy, log_pi=new_log_pi.detach().mean(),
                    total_loss=(td_loss + penalty + policy_loss).detach())  # fmt: skip
