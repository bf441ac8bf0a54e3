"""How runtimes assemble IMPALA: the only entry points they call."""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium as gym
import torch

from rlherd.agents.base import AgentBuilder
from rlherd.agents.impala.acting import ImpalaActor, sample_actions
from rlherd.agents.impala.config import DEFAULT_TOTAL_STEPS, PRESETS, ImpalaConfig
from rlherd.agents.impala.learning import Batch, ImpalaLearner
from rlherd.agents.impala.networks import ImpalaNet
from rlherd.core import EnvSpec


class ImpalaBuilder(AgentBuilder):
    name = "impala"
    config_class = ImpalaConfig
    presets = PRESETS
    runtimes = ("single", "mono", "poly")
    uses_loop = False
    default_total_steps = DEFAULT_TOTAL_STEPS

    def make_networks(self, spec: EnvSpec, device: str | None = None) -> ImpalaNet:
        return ImpalaNet(spec, self.config).to(device or self.config.device)

    def make_actor(self, net: ImpalaNet, envs: gym.vector.VectorEnv, seed: int) -> ImpalaActor:
        return ImpalaActor(net, envs, seed)

    def make_learner(
        self, net: ImpalaNet, total_steps: int, dataset: Iterator[Batch] | None = None
    ) -> ImpalaLearner:
        return ImpalaLearner(net, self.config, total_steps, dataset)

    def make_policy(self, net: ImpalaNet, evaluation: bool = True):
        """A stateful policy for one environment: ``policy(obs, first) -> action``.

        Evaluation acts greedily; otherwise it samples like the actors.
        """
        state = net.initial_state(1)
        generator = torch.Generator().manual_seed(0)

        @torch.no_grad()
        def policy(obs, first: bool) -> int:
            nonlocal state
            if first:
                state = net.initial_state(1)
            outputs, state = net(
                torch.as_tensor(obs)[None, None], torch.zeros(1, 1, dtype=torch.bool), state
            )
            logits = outputs["policy_logits"][0]
            return int(logits.argmax(-1) if evaluation else sample_actions(logits, generator))

        return policy
