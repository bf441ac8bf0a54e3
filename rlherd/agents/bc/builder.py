"""How the offline runtime assembles behaviour cloning: the policy network, a table holding the
dataset's transitions, the learner, and the policy an evaluator acts with."""

from __future__ import annotations

from rlherd.agents.acting import (
    CategoricalPolicy,
    FeedForwardPolicy,
    GaussianSamplingPolicy,
    TransitionActor,
)
from rlherd.agents.base import OFFLINE_ONLY, TransitionReplayBuilder
from rlherd.agents.bc.config import DEFAULT_TOTAL_STEPS, PRESETS, BCConfig
from rlherd.agents.bc.learning import BCLearner
from rlherd.agents.bc.networks import BCNetwork
from rlherd.core import EnvSpec, VariableSource
from rlherd.replay import BatchAdder, NStepTransitionAdder, Table


class BCBuilder(TransitionReplayBuilder):
    name = "bc"
    config_class = BCConfig
    presets = PRESETS
    default_total_steps = DEFAULT_TOTAL_STEPS
    runtimes, why_not = OFFLINE_ONLY

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> BCNetwork:
        return BCNetwork(spec, self.config).to(device)

    def make_policy(self, networks: BCNetwork, evaluation: bool = False) -> FeedForwardPolicy:
        kind = CategoricalPolicy if networks.discrete else GaussianSamplingPolicy
        return kind(networks, greedy=evaluation)

    def make_adder(self, tables: list[Table], num_envs: int) -> BatchAdder:
        """One-step transitions: cloning reads only each step's observation and action."""
        return BatchAdder([NStepTransitionAdder(tables[0], 1, 1.0) for _ in range(num_envs)])

    def make_actor(
        self,
        seed: int,
        policy: FeedForwardPolicy,
        spec: EnvSpec,
        adder: BatchAdder | None,
        variable_source: VariableSource | None,
    ) -> TransitionActor:
        return TransitionActor.build(policy, adder, seed, variable_source, 1)

    def make_learner(self, networks: BCNetwork, dataset, total_steps: int, tables=None):
        return BCLearner(networks, self.config, dataset)


__all__ = ["BCBuilder"]
