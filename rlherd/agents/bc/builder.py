"""How the offline runtime assembles behaviour cloning: the policy network, a table holding the
dataset's transitions, the learner, and the policy an evaluator acts with."""

from __future__ import annotations

from rlherd.agents.acting import (
    CategoricalPolicy,
    FeedForwardPolicy,
    GaussianSamplingPolicy,
)
from rlherd.agents.base import OfflineBuilder
from rlherd.agents.bc.config import DEFAULT_TOTAL_STEPS, PRESETS, BCConfig
from rlherd.agents.bc.learning import BCLearner
from rlherd.agents.bc.networks import BCNetwork
from rlherd.core import EnvSpec
from rlherd.replay import BatchAdder, NStepTransitionAdder, Table


class BCBuilder(OfflineBuilder):
    name = "bc"
    config_class = BCConfig
    presets = PRESETS
    default_total_steps = DEFAULT_TOTAL_STEPS

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> BCNetwork:
        return BCNetwork(spec, self.config).to(device)

    def make_policy(self, networks: BCNetwork, evaluation: bool = False) -> FeedForwardPolicy:
        kind = CategoricalPolicy if networks.discrete else GaussianSamplingPolicy
        return kind(networks, greedy=evaluation)

    def make_adder(self, tables: list[Table], num_envs: int) -> BatchAdder:
        """One-step transitions: cloning reads only each step's observation and action."""
        return BatchAdder([NStepTransitionAdder(tables[0], 1, 1.0) for _ in range(num_envs)])

    def make_learner(self, networks: BCNetwork, dataset, total_steps: int, tables=None):
        return BCLearner(networks, self.config, dataset)


__all__ = ["BCBuilder"]
