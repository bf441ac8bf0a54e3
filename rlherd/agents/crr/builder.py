"""How the offline runtime assembles CRR: a Gaussian policy and a critic, a table holding the
dataset's n-step transitions, the learner, and the policy an evaluator acts with (the mean)."""

from __future__ import annotations

from rlherd.agents.acting import GaussianSamplingPolicy
from rlherd.agents.base import OfflineBuilder
from rlherd.agents.crr.config import DEFAULT_TOTAL_STEPS, PRESETS, CRRConfig
from rlherd.agents.crr.learning import CRRLearner
from rlherd.core import EnvSpec
from rlherd.networks.continuous import (
    ActorCritic,
    Critic,
    GaussianPolicy,
    ObsVector,
    require_bounded_box,
)


class CRRBuilder(OfflineBuilder):
    name = "crr"
    config_class = CRRConfig
    presets = PRESETS
    default_total_steps = DEFAULT_TOTAL_STEPS

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> ActorCritic:
        require_bounded_box(spec, "crr")
        c, read = self.config, ObsVector(spec)
        policy = GaussianPolicy(read, spec.action_shape[0], tuple(c.policy_sizes),
                                c.policy_init_scale, c.policy_min_scale)  # fmt: skip
        critic = Critic(read, spec.action_shape[0], tuple(c.critic_sizes))
        return ActorCritic(spec, policy, critic).to(device)

    def make_policy(
        self, networks: ActorCritic, evaluation: bool = False
    ) -> GaussianSamplingPolicy:
        return GaussianSamplingPolicy(networks, greedy=evaluation)

    def make_learner(self, networks: ActorCritic, dataset, total_steps: int, tables=None):
        return CRRLearner(networks, self.config, dataset)


__all__ = ["CRRBuilder"]
