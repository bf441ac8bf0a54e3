"""How runtimes assemble SAC: twin critics and a tanh-Gaussian policy, one replay table of
n-step transitions paced by samples per insert, an actor that samples from the policy, the
learner, and an evaluator that acts with ``tanh`` of the Gaussian's mean."""

from __future__ import annotations

from rlherd.agents.acting import TanhGaussianSamplingPolicy
from rlherd.agents.continuous import ContinuousBuilder
from rlherd.agents.sac.config import PRESETS, SACConfig
from rlherd.agents.soft_actor_critic import SACLearner
from rlherd.core import EnvSpec
from rlherd.networks.continuous import SACNetworks


class SACBuilder(ContinuousBuilder):
    name = "sac"
    config_class = SACConfig
    presets = PRESETS

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> SACNetworks:
        return SACNetworks(spec, self.config, self.name).to(device)

    def make_policy(
        self, networks: SACNetworks, evaluation: bool = False
    ) -> TanhGaussianSamplingPolicy:
        return TanhGaussianSamplingPolicy(networks, evaluation, self.config.random_warm_up)

    def make_learner(self, networks: SACNetworks, dataset, total_steps: int, tables=None):
        return SACLearner(networks, self.config, dataset)


__all__ = ["SACBuilder"]
