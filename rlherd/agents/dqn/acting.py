"""DQN acts with :class:`DQNPolicy` (the Q-network's greedy action) and explores in
:class:`DQNActor` (epsilon-greedy on the actor's own random stream), writing n-step transitions
through its adder."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlherd import types as F
from rlherd.agents.acting import FeedForwardPolicy, as_tensor, explore, to_device
from rlherd.core import VariableClient
from rlherd.losses.td import greedy_action
from rlherd.replay import BatchAdder


def linear_epsilon(start: float, end: float, decay_steps: int) -> Callable[[int], float]:
    """Epsilon falling linearly from ``start`` to ``end`` over ``decay_steps`` agent steps
    (0: ``end`` from the start)."""

    def epsilon(step: int) -> float:
        left = 1.0 - step / decay_steps if decay_steps else 0.0
        return end + (start - end) * max(0.0, left)

    return epsilon


class DQNPolicy(FeedForwardPolicy):
    """A :class:`~rlherd.core.Policy`: Q-values, the greedy action (nothing random here) and the
    run's experience, which the actor's epsilon schedule reads. ``greedy`` tells an actor
    without an adder (an evaluation) whether to explore at all."""

    @torch.no_grad()
    def __call__(self, obs, first, state, generator):
        obs = to_device(obs, self.device)
        q = self.net(obs)
        experience = self.net.experience.expand(q.shape[0])  # per row, so batchers can split it
        action = greedy_action(q, F.action_mask(obs))
        return {F.ACTION: action, "q_values": q, "experience": experience}, state


class DQNActor:
    """An :class:`~rlherd.core.Actor`: epsilon-greedy around the policy's greedy action, one
    adder per environment (none: an evaluator). ``epsilon`` is a constant or a schedule of the
    run's experience: the environment steps of all actors, which the learner sends with the
    parameters (``net.experience``), or this actor's own steps until it hears of more."""

    def __init__(
        self,
        policy,
        adder: BatchAdder | None,
        epsilon: Callable[[int], float] | float,
        seed: int,
        client: VariableClient | None = None,
    ):
        self.policy, self.adder, self.client = policy, adder, client
        self.epsilon = epsilon if callable(epsilon) else (lambda step, e=epsilon: e)
        self.rng = np.random.default_rng(seed)
        self.steps = 0

    def select_action(self, obs: np.ndarray) -> np.ndarray:
        tensors = F.map_obs(as_tensor, obs)
        first = torch.zeros(F.obs_len(tensors), dtype=torch.bool)
        outputs, _ = self.policy(tensors, first, (), None)
        experience = max(self.steps, int(outputs["experience"][0]))
        return explore(self.rng, outputs[F.ACTION].cpu().numpy(), self.epsilon(experience), obs,
                       outputs["q_values"].shape[-1])  # fmt: skip

    def observe_first(self, obs: np.ndarray, envs: np.ndarray) -> None:
        if self.adder is not None:
            self.adder.add_first(obs, envs)

    def observe(self, action, reward, next_obs, terminated, truncated, skip, extras=None) -> None:
        self.steps += len(action)
        if self.adder is not None:
            self.adder.add(action, reward, next_obs, terminated, truncated, skip, extras)

    def update(self, wait: bool = False) -> None:
        if self.client is not None:
            self.client.update(wait)

    def state_dict(self) -> dict[str, Any]:
        adder = self.adder.state_dict() if self.adder is not None else None
        return dict(rng=self.rng.bit_generator.state, steps=self.steps, adder=adder)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.steps = state["steps"]
        if self.adder is not None:
            self.adder.load_state_dict(state["adder"])
