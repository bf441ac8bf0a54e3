"""Epsilon-greedy acting in a batch of environments, writing n-step transitions to replay."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlherd.replay import BatchAdder


def linear_epsilon(start: float, end: float, decay_steps: int) -> Callable[[int], float]:
    """Epsilon falling linearly from ``start`` to ``end`` over ``decay_steps`` agent steps."""

    def epsilon(step: int) -> float:
        return end + (start - end) * max(0.0, 1.0 - step / decay_steps)

    return epsilon


def apex_epsilons(num_actors: int, base: float = 0.4, alpha: float = 7.0) -> list[float]:
    """Ape-X's fixed per-actor exploration (Horgan et al. 2018): actor ``i`` of ``N`` uses
    ``base ** (1 + alpha * i / (N - 1))``; one actor uses ``base``."""
    if num_actors == 1:
        return [base]
    return [base ** (1 + alpha * i / (num_actors - 1)) for i in range(num_actors)]


class DQNActor:
    """An :class:`~rlherd.core.Actor`: epsilon-greedy in the Q-network, one adder per env.

    ``epsilon`` is a schedule of the actor's own step count (or a constant, as Ape-X's actors
    use). In one process the network is the learner's own; ``update`` has nothing to fetch.
    """

    def __init__(
        self,
        net: torch.nn.Module,
        adder: BatchAdder | None,
        epsilon: Callable[[int], float] | float,
        seed: int,
    ):
        self.net, self.adder = net, adder
        self.epsilon = epsilon if callable(epsilon) else (lambda step, e=epsilon: e)
        self.rng = np.random.default_rng(seed)
        self.device = next(net.parameters()).device
        self.steps = 0

    @torch.no_grad()
    def select_action(self, obs: np.ndarray) -> np.ndarray:
        q = self.net(torch.as_tensor(obs, device=self.device))
        greedy = q.argmax(-1).cpu().numpy()
        explore = self.rng.random(len(greedy)) < self.epsilon(self.steps)
        random = self.rng.integers(q.shape[-1], size=len(greedy))
        return np.where(explore, random, greedy)

    def observe_first(self, obs: np.ndarray, envs: np.ndarray) -> None:
        if self.adder is not None:
            self.adder.add_first(obs, envs)

    def observe(self, action, reward, next_obs, terminated, truncated, skip, extras=None) -> None:
        self.steps += len(action)
        if self.adder is not None:
            self.adder.add(action, reward, next_obs, terminated, truncated, skip, extras)

    def update(self, wait: bool = False) -> None:
        """The network is shared with the learner in one process: nothing to fetch."""

    def state_dict(self) -> dict[str, Any]:
        adder = self.adder.state_dict() if self.adder is not None else None
        return dict(rng=self.rng.bit_generator.state, steps=self.steps, adder=adder)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.steps = state["steps"]
        if self.adder is not None:
            self.adder.load_state_dict(state["adder"])
