"""How runtimes assemble TD3: a deterministic policy and twin critics, one replay table of
n-step transitions paced by samples per insert, an actor that adds Gaussian noise to the
policy's action, the learner, and an evaluator that acts with the policy alone."""

from __future__ import annotations

from rlherd.agents.acting import NoisyDeterministicPolicy
from rlherd.agents.continuous import ContinuousBuilder
from rlherd.agents.td3.config import PRESETS, TD3Config
from rlherd.agents.td3.learning import TD3Learner
from rlherd.core import EnvSpec
from rlherd.networks.continuous import TD3Networks


class TD3Builder(ContinuousBuilder):
    name = "td3"
    config_class = TD3Config
    presets = PRESETS

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> TD3Networks:
        return TD3Networks(spec, self.config, self.name).to(device)

    def make_policy(
        self, networks: TD3Networks, evaluation: bool = False
    ) -> NoisyDeterministicPolicy:
        c = self.config
        return NoisyDeterministicPolicy(networks, c.sigma, evaluation, c.random_warm_up)

    def make_learner(self, networks: TD3Networks, dataset, total_steps: int, tables=None):
        return TD3Learner(networks, self.config, dataset)


__all__ = ["TD3Builder"]
