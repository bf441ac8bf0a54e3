"""A turn-based PettingZoo game of one's own for the self-play tests (``pettingzoo/turn_game``).

Nim: a pile of ``pile`` stones, each player takes one or two in turn, and whoever takes the last
wins (+1, the other -1). A player observes the pile, one-hot, and the legal moves
(``action_mask``). ``fault`` breaks the second player's view or reward: ``shape`` (an
observation one longer), ``nan`` (an observation of NaN), ``reward`` (None after each move),
``mask`` (no action mask), ``mask2`` (a mask of 2s), ``nested`` (NaN in a leaf of a tuple
every observation holds), ``seats`` (the second player's observation space is longer)."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
from pettingzoo import AECEnv
from pettingzoo.utils import AgentSelector


class Nim(AECEnv):
    metadata = {"name": "turn_game", "is_parallelizable": False}

    def __init__(self, pile: int = 5, fault: str = ""):
        super().__init__()
        self.pile0, self.fault = pile, fault
        self.possible_agents = ["player_0", "player_1"]

    @functools.cache  # noqa: B019 (PettingZoo's test wants the same object each call)
    def observation_space(self, agent: str) -> gym.Space:
        longer = self.fault == "seats" and agent == "player_1"
        spaces = {
            "observation": gym.spaces.Box(0, 1, (self.pile0 + 1 + longer,), np.float32),
            "action_mask": gym.spaces.Box(0, 1, (2,), np.int8),
        }  # fmt: skip
        if self.fault == "nested":
            spaces["extra"] = gym.spaces.Tuple((gym.spaces.Discrete(2),
                                                gym.spaces.Box(-1, 1, (2,), np.float32)))
        return gym.spaces.Dict(spaces)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)  # take one stone, or two

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        board = np.zeros(self.pile0 + 1, np.float32)
        board[self.pile] = 1.0
        mask = np.array([self.pile >= 1, self.pile >= 2], np.int8)
        if agent == "player_1" and self.fault == "shape":
            board = np.zeros(self.pile0 + 2, np.float32)
        if agent == "player_1" and self.fault == "nan":
            board[:] = np.nan
        if agent == "player_1" and self.fault == "mask":
            return {"observation": board}
        if agent == "player_1" and self.fault == "mask2":
            mask = mask * 2
        if self.fault == "nested":
            extra = np.full(2, np.nan if agent == "player_1" else 0.0, np.float32)
            return {"observation": board, "action_mask": mask, "extra": (0, extra)}
        return {"observation": board, "action_mask": mask}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.pile = self.pile0
        self.rewards = {a: 0 for a in self.agents}
        self._cumulative_rewards = {a: 0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.reset()

    def step(self, action):
        if self.terminations[self.agent_selection] or self.truncations[self.agent_selection]:
            return self._was_dead_step(action)
        mover = self.agent_selection
        self.pile = max(0, self.pile - (int(action) + 1))
        self.rewards = {a: 0 for a in self.agents}
        if self.pile == 0:
            other = next(a for a in self.agents if a != mover)
            self.rewards = {mover: 1, other: -1}
            self.terminations = {a: True for a in self.agents}
        self._accumulate_rewards()
        if self.fault == "reward":
            self.rewards["player_1"] = None
        self.agent_selection = self._selector.next()


def env(**kwargs) -> Nim:
    return Nim(**kwargs)
