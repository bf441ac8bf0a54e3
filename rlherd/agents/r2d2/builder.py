"""How runtimes assemble R2D2: its network, a prioritised table of sequences paced by Acme's
samples-per-insert limiter, one sequence adder per environment, the recurrent policy and actor,
the learner. R2D3 is the same agent with demonstrations mixed into its batches."""

from __future__ import annotations

import numpy as np

from rlherd.agents.base import TransitionReplayBuilder
from rlherd.agents.r2d2.acting import STATE_KEYS, R2D2Actor, R2D2Policy, epsilon_set
from rlherd.agents.r2d2.config import (
    DEFAULT_TOTAL_STEPS,
    PRESETS,
    R2D3_RUNTIME_DEFAULTS,
    RUNTIME_DEFAULTS,
    R2D2Config,
)
from rlherd.agents.r2d2.learning import R2D2Learner
from rlherd.agents.r2d2.networks import R2D2Network
from rlherd.core import EnvSpec, VariableClient, VariableSource
from rlherd.replay import BatchAdder, Prioritized, SequenceAdder
from rlherd.replay.selectors import Selector


class R2D2Builder(TransitionReplayBuilder):
    name = "r2d2"
    config_class = R2D2Config
    presets = PRESETS
    default_total_steps = DEFAULT_TOTAL_STEPS
    runtime_defaults = RUNTIME_DEFAULTS

    @classmethod
    def preset_for(cls, env_id: str) -> str:
        """The family's preset, but ``classic`` for rlherd/MaskedCartPole: a CartPole, on which
        ``classic`` was tuned; ``toy`` is for the tiny tasks (Corridor, DeepSea)."""
        if env_id.startswith("rlherd/MaskedCartPole"):
            return "classic"
        return super().preset_for(env_id)

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> R2D2Network:
        return R2D2Network(spec, self.config).to(device)

    def sampler(self) -> Selector:
        return Prioritized(self.config.priority_exponent)

    def item_signature(self, spec: EnvSpec) -> dict:
        """Sequences of ``burn_in + trace_length + 1`` rows, with the LSTM state (h, c) the actor
        had before their first row."""
        state = {k: ((1, self.config.lstm_size), np.float32) for k in STATE_KEYS}
        return SequenceAdder.signature(spec, self.config.sequence_length, state=state)

    def make_adder(self, tables: list, num_envs: int) -> BatchAdder:
        """Sequences start every ``sequence_period`` steps and stay inside their episode, padded
        after its final observation (Acme's zero padding)."""
        c = self.config
        return BatchAdder([
            SequenceAdder(tables[0], c.sequence_length, c.sequence_period, "pad", STATE_KEYS)
            for _ in range(num_envs)
        ])  # fmt: skip

    def make_policy(self, networks: R2D2Network, evaluation: bool = False) -> R2D2Policy:
        return R2D2Policy(networks, greedy=evaluation)

    def make_actor(
        self,
        seed: int,
        policy: R2D2Policy,
        spec: EnvSpec,
        adder: BatchAdder | None,
        variable_source: VariableSource | None,
    ) -> R2D2Actor:
        """An evaluator (no adder) with the greedy policy acts with ``evaluation_epsilon``;
        otherwise each episode draws its epsilon from the set (``rlherd eval --sample`` too)."""
        c = self.config
        epsilons = epsilon_set(c.num_epsilons)
        if adder is None and getattr(policy, "greedy", True):
            epsilons = c.evaluation_epsilon
        client = None
        if variable_source is not None:
            client = VariableClient(variable_source, policy.net, "policy", c.variable_update_period)
        return R2D2Actor(policy, adder, epsilons, seed, client)

    def make_learner(self, networks: R2D2Network, dataset, total_steps: int, tables=None):
        return R2D2Learner(networks, self.config, dataset, tables[0] if tables else None)


class R2D3Builder(R2D2Builder):
    """R2D3 (Paine et al. 2019): R2D2 whose batches mix in sequences of demonstrations, cut from
    demonstration episodes by R2D2's own adder (burn-in included; their stored state is zero, as
    no actor read them). By default the environment's scripted expert makes up a quarter of
    each batch; ``--demonstrations ID`` names recorded episodes."""

    name = "r2d3"
    runtime_defaults = R2D3_RUNTIME_DEFAULTS
    needs = frozenset({"replay", "acting"})
    why_not = (
        "it mixes demonstrations into replay of its own acting; offline, train r2d2 --dataset ID"
    )


__all__ = ["R2D2Builder", "R2D3Builder"]
