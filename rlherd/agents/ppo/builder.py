"""How runtimes assemble PPO: the networks, the rollout queue (its adder and dataset), the actor
and the learner."""

from __future__ import annotations

import numpy as np

from rlherd.agents.base import AgentBuilder
from rlherd.agents.ppo.acting import PPOActor, rollout_fields
from rlherd.agents.ppo.config import DEFAULT_TOTAL_STEPS, PRESETS, PPOConfig, preset_for
from rlherd.agents.ppo.learning import PPOLearner
from rlherd.agents.ppo.networks import PPONet
from rlherd.core import EnvSpec
from rlherd.replay.rollouts import RolloutQueue


class PPOBuilder(AgentBuilder):
    name = "ppo"
    config_class = PPOConfig
    presets = PRESETS
    default_total_steps = DEFAULT_TOTAL_STEPS
    runtimes = ("single", "device")
    uses_loop = True
    preset_for = staticmethod(preset_for)

    def make_networks(self, spec: EnvSpec, device: str | None = None) -> PPONet:
        return PPONet(spec, self.config).to(device or self.config.device)

    def make_replay_tables(self, spec: EnvSpec, insert_blocking: bool = True) -> list[RolloutQueue]:
        """One queue of ``[T + 1, B]`` rollouts, each consumed once (on-policy)."""
        c = self.config
        fields = rollout_fields(spec, PPONet(spec, c))
        return [RolloutQueue(fields, c.unroll_length, c.num_envs)]

    def make_dataset(self, tables: list[RolloutQueue]) -> RolloutQueue:
        return tables[0]

    def make_adder(self, tables: list[RolloutQueue], num_envs: int) -> RolloutQueue:
        if num_envs != tables[0].B:
            raise ValueError(f"the rollout queue holds {tables[0].B} environments, not {num_envs}")
        return tables[0]

    def make_actor(self, net: PPONet, adder: RolloutQueue | None, seed: int) -> PPOActor:
        return PPOActor(net, self.config, adder, seed)

    def make_learner(self, net: PPONet, total_steps: int, dataset=None, tables=None) -> PPOLearner:
        return PPOLearner(net, self.config, total_steps, dataset)

    def make_policy(self, net: PPONet, evaluation: bool = True):
        """``policy(obs, first) -> action`` for one environment: the distribution's mode
        (greedy / mean action) when evaluating, else a sample. Observations are normalised with
        the trained statistics, which this policy never updates."""
        actor = PPOActor(net, self.config, None, seed=0, greedy=evaluation)

        def policy(obs, first: bool):
            action = actor.select_action(np.asarray(obs)[None])[0]
            return int(action) if actor.spec.action_kind == "discrete" else action

        return policy


__all__ = ["PPOBuilder"]
