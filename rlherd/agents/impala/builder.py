"""How runtimes assemble IMPALA: the only entry points they call."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from rlherd import types as F
from rlherd.agents.acting import RolloutActor
from rlherd.agents.base import RolloutAgentBuilder
from rlherd.agents.impala.acting import ImpalaPolicy
from rlherd.agents.impala.config import DEFAULT_TOTAL_STEPS, PRESETS, RUNTIME_DEFAULTS, ImpalaConfig
from rlherd.agents.impala.learning import ImpalaLearner
from rlherd.agents.impala.networks import ImpalaNet
from rlherd.core import EnvSpec, VariableClient, VariableSource
from rlherd.replay.rollouts import RolloutWriter


class ImpalaBuilder(RolloutAgentBuilder):
    name = "impala"
    config_class = ImpalaConfig
    presets = PRESETS
    default_total_steps = DEFAULT_TOTAL_STEPS
    runtime_defaults = RUNTIME_DEFAULTS

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> ImpalaNet:
        return ImpalaNet(spec, self.config).to(device)

    def rollout_fields(self, spec: EnvSpec) -> dict[str, tuple]:
        return {
            F.ACTION: ((), torch.int64),
            F.POLICY_LOGITS: ((spec.num_actions,), torch.float32),
            F.BASELINE: ((), torch.float32),
        }

    def make_policy(self, networks: ImpalaNet, evaluation: bool = False) -> ImpalaPolicy:
        """Samples like TorchBeast's actors; evaluation acts greedily."""
        return ImpalaPolicy(networks, greedy=evaluation)

    def make_actor(
        self,
        seed: int,
        policy: ImpalaPolicy,
        spec: EnvSpec,
        adder: RolloutWriter | None,
        variable_source: VariableSource | None,
    ) -> RolloutActor:
        # On-policy: act with the newest parameters (the client copies only when they changed).
        client = VariableClient(variable_source, policy.net) if variable_source else None
        return RolloutActor(policy, adder, seed, client)

    def make_learner(
        self, networks: ImpalaNet, dataset: Iterator, total_steps: int, tables=None
    ) -> ImpalaLearner:
        return ImpalaLearner(networks, self.config, total_steps, dataset)
