"""How runtimes assemble DQN: networks, the replay table, dataset, adders, policy, actor,
learner."""

from __future__ import annotations

from rlherd.agents.base import AgentBuilder
from rlherd.agents.dqn.acting import DQNActor, DQNPolicy, linear_epsilon
from rlherd.agents.dqn.config import DEFAULT_TOTAL_STEPS, PRESETS, RUNTIME_DEFAULTS, DQNConfig
from rlherd.agents.dqn.learning import DQNLearner
from rlherd.agents.dqn.networks import QNetwork
from rlherd.core import EnvSpec, VariableClient, VariableSource
from rlherd.replay import (
    BatchAdder,
    Bursts,
    Fifo,
    NStepTransitionAdder,
    Prioritized,
    ReplayDataset,
    SampleToInsertRatio,
    Table,
    Uniform,
)

SAMPLE_TIMEOUT_S = 1.0  # a learner waiting on the rate limiter wakes this often (runtimes retry)


class DQNBuilder(AgentBuilder):
    name = "dqn"
    config_class = DQNConfig
    presets = PRESETS
    default_total_steps = DEFAULT_TOTAL_STEPS
    runtime_defaults = RUNTIME_DEFAULTS
    dataflow = "replay"

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> QNetwork:
        return QNetwork(spec, self.config).to(device)

    def make_replay_tables(self, spec: EnvSpec, insert_blocking: bool = True) -> list[Table]:
        """One table of n-step transitions. In one process (``insert_blocking=False``) inserts
        never wait and the learner steps whenever the rate limiter lets it sample."""
        c = self.config
        if c.train_every:
            limiter = Bursts(c.train_every, c.gradient_steps * c.batch_size, c.min_replay_size)
        else:
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

    def make_dataset(self, tables: list[Table], device: str = "cpu") -> ReplayDataset:
        return ReplayDataset(tables[0], self.config.batch_size, device, timeout=SAMPLE_TIMEOUT_S)

    def make_adder(self, tables: list[Table], num_envs: int) -> BatchAdder:
        c = self.config
        return BatchAdder(
            [NStepTransitionAdder(tables[0], c.n_step, c.discount) for _ in range(num_envs)]
        )

    def make_policy(self, networks: QNetwork, evaluation: bool = False) -> DQNPolicy:
        return DQNPolicy(networks, greedy=evaluation)

    def make_actor(
        self,
        seed: int,
        policy: DQNPolicy,
        spec: EnvSpec,
        adder: BatchAdder | None,
        variable_source: VariableSource | None,
    ) -> DQNActor:
        """Epsilon-greedy with the training schedule; an evaluator (no adder) acts greedily, or
        with the final epsilon when its policy is not the greedy one (``rlherd eval --sample``)."""
        c = self.config
        epsilon = 0.0 if getattr(policy, "greedy", True) else c.epsilon_end
        if adder is not None:
            epsilon = linear_epsilon(c.epsilon_start, c.epsilon_end, c.epsilon_decay_steps)
        client = None
        if variable_source is not None:
            client = VariableClient(variable_source, policy.net, "policy", c.variable_update_period)
        return DQNActor(policy, adder, epsilon, seed, client)

    def make_learner(self, networks: QNetwork, dataset, total_steps: int, tables=None):
        table = tables[0] if tables else None  # priorities are written back to it
        return DQNLearner(networks, self.config, total_steps, dataset, table)


__all__ = ["DQNBuilder"]
