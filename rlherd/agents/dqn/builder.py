"""How runtimes assemble DQN: networks, the replay table, dataset, adders, actor, learner."""

from __future__ import annotations

import numpy as np

from rlherd.agents.base import AgentBuilder
from rlherd.agents.dqn.acting import DQNActor, linear_epsilon
from rlherd.agents.dqn.config import DEFAULT_TOTAL_STEPS, PRESETS, DQNConfig
from rlherd.agents.dqn.learning import DQNLearner
from rlherd.agents.dqn.networks import QNetwork
from rlherd.core import EnvSpec
from rlherd.replay import (
    BatchAdder,
    Fifo,
    NStepTransitionAdder,
    Prioritized,
    ReplayDataset,
    SampleToInsertRatio,
    Table,
    Uniform,
)


class DQNBuilder(AgentBuilder):
    name = "dqn"
    config_class = DQNConfig
    presets = PRESETS
    default_total_steps = DEFAULT_TOTAL_STEPS
    runtimes = ("single",)
    uses_loop = True

    def make_networks(self, spec: EnvSpec, device: str | None = None) -> QNetwork:
        return QNetwork(spec, self.config).to(device or self.config.device)

    def make_replay_tables(self, spec: EnvSpec, insert_blocking: bool = True) -> list[Table]:
        """One table of n-step transitions. In one process (``insert_blocking=False``) inserts
        never wait and the learner steps whenever the rate limiter lets it sample."""
        c = self.config
        error_buffer = max(
            c.min_replay_size * c.samples_per_insert * c.samples_per_insert_tolerance,
            2 * max(1.0, c.samples_per_insert),
        )
        limiter = SampleToInsertRatio(c.samples_per_insert, c.min_replay_size, error_buffer)
        if not insert_blocking:
            limiter = limiter.without_insert_blocking()
        sampler = Prioritized(c.priority_exponent) if c.prioritized else Uniform()
        signature = NStepTransitionAdder.signature(spec)
        return [Table("replay", signature, c.replay_size, sampler, Fifo(), 0, limiter)]

    def make_dataset(self, tables: list[Table]) -> ReplayDataset:
        c = self.config
        return ReplayDataset(tables[0], c.batch_size, c.device, prefetch=c.prefetch)

    def make_adder(self, tables: list[Table], num_envs: int) -> BatchAdder:
        c = self.config
        return BatchAdder(
            [NStepTransitionAdder(tables[0], c.n_step, c.discount) for _ in range(num_envs)]
        )

    def make_actor(self, net: QNetwork, adder: BatchAdder | None, seed: int, epsilon=None):
        c = self.config
        if epsilon is None:
            epsilon = linear_epsilon(c.epsilon_start, c.epsilon_end, c.epsilon_decay_steps)
        return DQNActor(net, adder, epsilon, seed)

    def make_learner(self, net: QNetwork, total_steps: int, dataset=None, tables=None):
        return DQNLearner(net, self.config, total_steps, dataset, tables[0] if tables else None)

    def make_policy(self, net: QNetwork, evaluation: bool = True):
        """``policy(obs, first) -> action`` for one environment: greedy, or with the final
        training epsilon when not evaluating."""
        actor = DQNActor(net, None, 0.0 if evaluation else self.config.epsilon_end, seed=0)

        def policy(obs, first: bool) -> int:
            return int(actor.select_action(np.asarray(obs)[None])[0])

        return policy


__all__ = ["DQNBuilder"]
