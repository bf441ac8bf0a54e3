"""How runtimes assemble SAC: twin critics and a tanh-Gaussian policy, one replay table of
n-step transitions paced by samples per insert, an actor that samples from the policy, the
learner, and an evaluator that acts with ``tanh`` of the Gaussian's mean."""

from __future__ import annotations

from rlherd.agents.acting import TanhGaussianSamplingPolicy, TransitionActor
from rlherd.agents.base import TransitionReplayBuilder
from rlherd.agents.continuous import DEFAULT_TOTAL_STEPS, RUNTIME_DEFAULTS, preset_for
from rlherd.agents.sac.config import PRESETS, SACConfig
from rlherd.agents.sac.learning import SACLearner
from rlherd.core import EnvSpec, VariableSource
from rlherd.networks.continuous import SACNetworks
from rlherd.replay import BatchAdder


class SACBuilder(TransitionReplayBuilder):
    name = "sac"
    config_class = SACConfig
    presets = PRESETS
    default_total_steps = DEFAULT_TOTAL_STEPS
    runtime_defaults = RUNTIME_DEFAULTS
    preset_for = staticmethod(preset_for)

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> SACNetworks:
        return SACNetworks(spec, self.config, self.name).to(device)

    def make_policy(
        self, networks: SACNetworks, evaluation: bool = False
    ) -> TanhGaussianSamplingPolicy:
        return TanhGaussianSamplingPolicy(networks, greedy=evaluation)

    def make_actor(
        self,
        seed: int,
        policy: TanhGaussianSamplingPolicy,
        spec: EnvSpec,
        adder: BatchAdder | None,
        variable_source: VariableSource | None,
    ) -> TransitionActor:
        c = self.config
        return TransitionActor.build(policy, adder, seed, variable_source,
                                     c.variable_update_period, c.random_steps)  # fmt: skip

    def make_learner(self, networks: SACNetworks, dataset, total_steps: int, tables=None):
        return SACLearner(networks, self.config, dataset)


__all__ = ["SACBuilder"]
