"""How runtimes assemble PPO: networks, the policy, the actor, the rollout fields, the learner."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from rlherd import types as F
from rlherd.agents.base import RolloutAgentBuilder
from rlherd.agents.ppo.acting import PPOActor
from rlherd.agents.ppo.config import (
    DEFAULT_TOTAL_STEPS,
    PRESETS,
    RUNTIME_DEFAULTS,
    PPOConfig,
    preset_for,
)
from rlherd.agents.ppo.learning import PPOLearner
from rlherd.agents.ppo.networks import PPONet, PPOPolicy
from rlherd.core import EnvSpec, VariableClient, VariableSource
from rlherd.networks.distributions import distribution_for
from rlherd.replay.rollouts import RolloutWriter


class PPOBuilder(RolloutAgentBuilder):
    name = "ppo"
    config_class = PPOConfig
    presets = PRESETS
    default_total_steps = DEFAULT_TOTAL_STEPS
    runtime_defaults = RUNTIME_DEFAULTS
    preset_for = staticmethod(preset_for)

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> PPONet:
        return PPONet(spec, self.config).to(device)

    def rollout_fields(self, spec: EnvSpec) -> dict[str, tuple]:
        """The sampled action, its log probability, the distribution's parameters, the value."""
        _, num_params = distribution_for(spec)
        action = {
            "discrete": ((), torch.int64),
            "multidiscrete": (spec.action_shape, torch.int64),
            "continuous": (spec.action_shape, torch.float32),
        }[spec.action_kind]
        return {
            F.ACTION: action,
            F.BEHAVIOUR_LOG_PROB: ((), torch.float32),
            F.POLICY_PARAMS: ((num_params,), torch.float32),
            F.BASELINE: ((), torch.float32),
        }

    def actor_only_features(self) -> list[str]:
        """Reward scaling keeps running statistics in the actor (see :mod:`.acting`)."""
        return ["reward_scaling"] if self.config.reward_scaling is not None else []

    def make_policy(self, networks: PPONet, evaluation: bool = False) -> PPOPolicy:
        """Samples; evaluation takes the distribution's mode (greedy / mean action)."""
        return PPOPolicy(networks, greedy=evaluation)

    def make_actor(
        self,
        seed: int,
        policy: PPOPolicy,
        spec: EnvSpec,
        adder: RolloutWriter | None,
        variable_source: VariableSource | None,
    ) -> PPOActor:
        # The parameters and the observation statistics, whenever the learner changed them.
        client = VariableClient(variable_source, policy.net) if variable_source else None
        return PPOActor(policy, adder, seed, client, spec, self.config)

    def make_learner(
        self, networks: PPONet, dataset: Iterator, total_steps: int, tables=None
    ) -> PPOLearner:
        return PPOLearner(networks, self.config, total_steps, dataset)
