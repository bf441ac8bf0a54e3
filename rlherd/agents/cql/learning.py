"""CQL's learners (Kumar et al. 2020, "Conservative Q-Learning for Offline RL"): Q-learning
whose values of actions the dataset does not take are pushed down by the CQL(H) penalty
(:mod:`rlherd.losses.offline`), with a fixed coefficient or its Lagrange form.

- :class:`DiscreteCQLLearner`: double Q-learning with n-step targets and a target network.
- :class:`ContinuousCQLLearner`: SAC's learner (twin critics, Polyak targets, an entropy term
  fixed or tuned) with the penalty on its critics; the policy clones the dataset for
  ``num_bc_iters`` steps, then maximises the smaller critic.
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
from rlherd.agents.soft_actor_critic import SACLearner
from rlherd.losses.offline import cql_gap_continuous, cql_gap_discrete, cql_lagrange_loss
from rlherd.losses.td import double_q_learning_td, huber
from rlherd.networks.continuous import SACNetworks, tanh_gaussian_log_prob, tanh_gaussian_sample
from rlherd.replay.dataset import ReplaySample


class Conservative:
    """CQL's conservative coefficient, which both learners share: a number, or ``exp(log_alpha)``
    tuned by its Lagrange form (each learner makes ``log_alpha`` and gives it an optimiser)."""

    config: CQLConfig
    log_alpha: torch.Tensor

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


class DiscreteCQLLearner(Conservative, NetworkLearner):
    checkpointed = ("net", "target_net", "log_alpha")

    def __init__(self, net: DiscreteQ, config: CQLConfig, dataset: Iterator[ReplaySample]):
        self.net, self.config, self.dataset = net, config, dataset
        self.target_net = copy.deepcopy(net)
        self.target_net.requires_grad_(False)
        self.log_alpha = torch.zeros((), device=next(net.parameters()).device, requires_grad=True)
        self.optimizers = dict(q=adam(net.parameters(), config.learning_rate),
                               alpha=adam([self.log_alpha], config.learning_rate))  # fmt: skip
        self.num_steps = 0

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


class ContinuousCQLLearner(Conservative, SACLearner):
    """SAC's learner (:class:`~rlherd.agents.sac.SACLearner`) whose critics pay the conservative
    penalty, and whose policy clones the dataset's actions for ``num_bc_iters`` steps first."""

    checkpointed = (*SACLearner.checkpointed, "log_alpha")

    def __init__(self, net: SACNetworks, config: CQLConfig, dataset: Iterator[ReplaySample]):
        self.log_alpha = torch.zeros((), device=next(net.parameters()).device, requires_grad=True)
        super().__init__(net, config, dataset, duals=[self.log_alpha])

    def critic_penalty(self, obs, next_obs, action: torch.Tensor):
        """Each critic's CQL(H) penalty: the log-sum-exp of its values at uniform actions and at
        the policy's (at ``obs`` and at ``next_obs``), less its values at the data's actions."""
        n, net = self.config.cql_num_samples, self.net
        with torch.no_grad():
            uniform = torch.rand(n, *action.shape, device=action.device) * 2.0 - 1.0
            at_obs, log_pi = tanh_gaussian_sample(*net.policy(obs), n)
            at_next, log_pi_next = tanh_gaussian_sample(*net.policy(next_obs), n)
        obs_n = F.map_obs(lambda x: x.expand(n, *x.shape), obs)
        penalty, gaps = torch.zeros((), device=action.device), []
        for critic in (net.q1, net.q2):
            gap = cql_gap_continuous(critic(obs, action), critic(obs_n, uniform),
                                     critic(obs_n, at_obs), log_pi, critic(obs_n, at_next),
                                     log_pi_next, action.shape[-1])  # fmt: skip
            critic_penalty, alpha_loss = self.penalty(gap)
            penalty = penalty + critic_penalty + alpha_loss / 2
            gaps.append(gap.detach().mean())
        return penalty, dict(cql_gap=torch.stack(gaps).mean(), cql_coefficient=self.coefficient())

    def policy_value(self, obs, action, mean, log_std, data_action) -> torch.Tensor:
        """The dataset's actions' log-density for the first ``num_bc_iters`` steps (behaviour
        cloning), the smaller critic after."""
        if self.num_steps < self.config.num_bc_iters:
            return tanh_gaussian_log_prob(mean, log_std, data_action)
        return super().policy_value(obs, action, mean, log_std, data_action)
