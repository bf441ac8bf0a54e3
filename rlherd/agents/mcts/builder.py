"""How runtimes assemble MCTS: the policy-value network (and a learned model), a replay table of
n-step transitions carrying the search policy, the searching actor and the learner."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlherd.agents.base import TransitionReplayBuilder
from rlherd.agents.mcts.acting import MCTSActor, MCTSPolicy
from rlherd.agents.mcts.config import DEFAULT_TOTAL_STEPS, PRESETS, RUNTIME_DEFAULTS, MCTSConfig
from rlherd.agents.mcts.learning import MCTSLearner
from rlherd.agents.mcts.models import LearnedModel, Simulator
from rlherd.agents.mcts.networks import MCTSNetworks
from rlherd.core import EnvSpec, VariableClient, VariableSource
from rlherd.replay import BatchAdder, NStepTransitionAdder, Table


class MCTSBuilder(TransitionReplayBuilder):
    name = "mcts"
    config_class = MCTSConfig
    presets = PRESETS
    default_total_steps = DEFAULT_TOTAL_STEPS
    runtime_defaults = RUNTIME_DEFAULTS
    # Its search needs the environments (a simulator) or the model beside the network in the
    # actor's process, not a shared inference server (poly's actors act through one).
    needs = frozenset({"replay", "acting", "actor_network"})
    why_not = (
        "its actors search, with the network and the model in their own process, and its "
        "policy learns from those searches, which no offline dataset holds"
    )

    def extras_signature(self, spec: EnvSpec) -> dict:
        """The search policy; with a learned model, also the first step of each n-step
        transition (the one-step transition the model learns)."""
        extras = {"search_policy": ((spec.num_actions,), np.float32)}
        if self.config.model == "learned":
            extras.update(step_next_obs=(spec.obs_shape, spec.obs_dtype),
                          step_reward=((), np.float32), step_terminated=((), np.bool_))  # fmt: skip
        return extras

    def check_environments(self, spec: EnvSpec, envs: Any) -> None:
        """The simulator copies the environments it plays: try it, as a run's first step would."""
        if self.config.model == "simulator":
            played = envs.envs if isinstance(envs, gym.vector.SyncVectorEnv) else None
            Simulator(spec).bind(played)

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> MCTSNetworks:
        return MCTSNetworks(spec, self.config).to(device)

    def make_policy(self, networks: MCTSNetworks, evaluation: bool = False) -> MCTSPolicy:
        return MCTSPolicy(networks, greedy=evaluation)

    def make_adder(self, tables: list[Table], num_envs: int) -> BatchAdder:
        """Two-player games add rewards with the signed discount: each counts for its mover."""
        c = self.config
        return BatchAdder([NStepTransitionAdder(tables[0], c.n_step, c.signed_discount)
                           for _ in range(num_envs)])  # fmt: skip

    def make_actor(
        self,
        seed: int,
        policy: MCTSPolicy,
        spec: EnvSpec,
        adder: BatchAdder | None,
        variable_source: VariableSource | None,
    ) -> MCTSActor:
        """A training actor samples visits at the config's temperature; an evaluator with the
        greedy policy takes the most visited action."""
        c = self.config
        model = Simulator(spec) if c.model == "simulator" else LearnedModel(policy.net.model)
        temperature = c.temperature if adder is not None or not policy.greedy else 0.0
        client = None
        if variable_source is not None:
            client = VariableClient(variable_source, policy.net, "policy", c.variable_update_period)
        return MCTSActor(policy, model, c.search_settings(), temperature, adder, seed,
                         spec.num_actions, client, record_steps=c.model == "learned")  # fmt: skip

    def make_learner(self, networks: MCTSNetworks, dataset, total_steps: int, tables=None):
        return MCTSLearner(networks, self.config, dataset)


__all__ = ["MCTSBuilder"]
