"""How the offline runtime assembles CQL: the networks for the task's actions (a Q-network, or a
SAC actor-critic), a table holding the dataset's n-step transitions, the learner, and the
policy an evaluator acts with (the best action, or the tanh of the Gaussian's mean)."""

from __future__ import annotations

from rlherd.agents.acting import CategoricalPolicy, FeedForwardPolicy, TanhGaussianSamplingPolicy
from rlherd.agents.base import OfflineBuilder
from rlherd.agents.cql.config import DEFAULT_TOTAL_STEPS, PRESETS, CQLConfig
from rlherd.agents.cql.learning import ContinuousCQLLearner, DiscreteCQLLearner
from rlherd.agents.cql.networks import DiscreteQ, make_networks
from rlherd.core import EnvSpec
from rlherd.networks.continuous import SACNetworks


class CQLBuilder(OfflineBuilder):
    name = "cql"
    config_class = CQLConfig
    presets = PRESETS
    default_total_steps = DEFAULT_TOTAL_STEPS

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> DiscreteQ | SACNetworks:
        return make_networks(spec, self.config).to(device)

    def make_policy(self, networks, evaluation: bool = False) -> FeedForwardPolicy:
        kind = CategoricalPolicy if networks.discrete else TanhGaussianSamplingPolicy
        return kind(networks, greedy=evaluation)

    def make_learner(self, networks, dataset, total_steps: int, tables=None):
        learner = DiscreteCQLLearner if networks.discrete else ContinuousCQLLearner
        return learner(networks, self.config, dataset)


__all__ = ["CQLBuilder"]
