"""How runtimes assemble DQN: networks, the replay table, dataset, adders, policy, actor,
learner."""

from __future__ import annotations

from rlherd.agents.base import TransitionReplayBuilder
from rlherd.agents.dqn.acting import DQNActor, DQNPolicy, linear_epsilon
from rlherd.agents.dqn.config import (
    DEFAULT_TOTAL_STEPS,
    DQFD_DEFAULT_TOTAL_STEPS,
    DQFD_PRESETS,
    DQFD_RUNTIME_DEFAULTS,
    PRESETS,
    RUNTIME_DEFAULTS,
    DQNConfig,
)
from rlherd.agents.dqn.learning import DQNLearner
from rlherd.agents.dqn.networks import QNetwork
from rlherd.core import EnvSpec, VariableClient, VariableSource
from rlherd.replay import BatchAdder, Bursts, Prioritized, RateLimiter, Uniform
from rlherd.replay.selectors import Selector


class DQNBuilder(TransitionReplayBuilder):
    name = "dqn"
    config_class = DQNConfig
    presets = PRESETS
    default_total_steps = DEFAULT_TOTAL_STEPS
    runtime_defaults = RUNTIME_DEFAULTS

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> QNetwork:
        return QNetwork(spec, self.config).to(device)

    def rate_limiter(self) -> RateLimiter:
        """Acme's samples-per-insert ratio, or SB3's bursts with ``train_every``."""
        c = self.config
        if c.train_every:
            return Bursts(c.train_every, c.gradient_steps * c.batch_size, c.min_replay_size)
        return super().rate_limiter()

    def sampler(self) -> Selector:
        return Prioritized(self.config.priority_exponent) if self.config.prioritized else Uniform()

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


class DQfDBuilder(DQNBuilder):
    """DQfD: DQN whose batches mix in demonstrations (by default the environment's scripted
    expert, half of each batch; ``--demonstrations ID`` names recorded ones), with DQfD's
    large-margin loss on them when ``margin_loss_weight`` is set. It learns from its own
    experience too, so it runs where actors do."""

    name = "dqfd"
    presets = DQFD_PRESETS
    default_total_steps = DQFD_DEFAULT_TOTAL_STEPS
    runtime_defaults = DQFD_RUNTIME_DEFAULTS
    needs = frozenset({"replay", "acting"})
    why_not = (
        "it mixes demonstrations into replay of its own acting; offline, train dqn --dataset ID"
    )


__all__ = ["DQNBuilder", "DQfDBuilder"]
