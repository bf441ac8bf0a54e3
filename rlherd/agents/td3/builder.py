"""How runtimes assemble TD3: a deterministic policy and twin critics, one replay table of
n-step transitions paced by samples per insert, an actor that adds Gaussian noise to the
policy's action, the learner, and an evaluator that acts with the policy alone."""

from __future__ import annotations

from rlherd.agents.acting import NoisyDeterministicPolicy, TransitionActor
from rlherd.agents.base import TransitionReplayBuilder
from rlherd.agents.continuous import DEFAULT_TOTAL_STEPS, RUNTIME_DEFAULTS, preset_for
from rlherd.agents.td3.config import PRESETS, TD3Config
from rlherd.agents.td3.learning import TD3Learner
from rlherd.core import EnvSpec, VariableSource
from rlherd.networks.continuous import TD3Networks
from rlherd.replay import BatchAdder


class TD3Builder(TransitionReplayBuilder):
    name = "td3"
    config_class = TD3Config
    presets = PRESETS
    default_total_steps = DEFAULT_TOTAL_STEPS
    runtime_defaults = RUNTIME_DEFAULTS
    preset_for = staticmethod(preset_for)

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> TD3Networks:
        return TD3Networks(spec, self.config, self.name).to(device)

    def make_policy(
        self, networks: TD3Networks, evaluation: bool = False
    ) -> NoisyDeterministicPolicy:
        return NoisyDeterministicPolicy(networks, self.config.sigma, greedy=evaluation)

    def make_actor(
        self,
        seed: int,
        policy: NoisyDeterministicPolicy,
        spec: EnvSpec,
        adder: BatchAdder | None,
        variable_source: VariableSource | None,
    ) -> TransitionActor:
        c = self.config
        return TransitionActor.build(policy, adder, seed, variable_source,
                                     c.variable_update_period, c.random_steps)  # fmt: skip

    def make_learner(self, networks: TD3Networks, dataset, total_steps: int, tables=None):
        return TD3Learner(networks, self.config, dataset)


__all__ = ["TD3Builder"]
