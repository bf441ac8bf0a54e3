"""A scripted PettingZoo parallel game for the multi-agent tests (``pettingzoo/scripted_game``).

Agent ``i`` observes ``[i, t]`` (its index and the step) and is rewarded ``i + 1`` for action
``1`` and ``0`` otherwise, so each row's data shows whose it is; the game lasts ``length``
steps. With ``leave=True`` agent 0 leaves after its first step (terminated); with ``join=N`` it
joins at step ``N`` (absent before); with ``stranger=True`` an agent not among
``possible_agents`` joins at step 1; with ``mixed=True`` the agents' spaces differ (agent 0
observes a longer vector); with ``mixed_actions=True`` agent 0 chooses among 3 actions, the
others 2; with ``box_actions=True`` agent 0 acts in a Box. ``fault`` breaks agent 1's step:
``shape`` (an observation of 5), ``nan`` (an observation of NaN), ``reward`` (None), ``missing``
(no observation)."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv


class ScriptedGame(ParallelEnv):
    metadata = {"name": "scripted_game"}

    def __init__(self, agents: int = 3, length: int = 5, leave: bool = False, join: int = 0,
                 stranger: bool = False, mixed: bool = False,
                 mixed_actions: bool = False, box_actions: bool = False,
                 fault: str = ""):  # fmt: skip
        self.possible_agents = [f"agent_{i}" for i in range(agents)]
        self.fault = fault
        self.length, self.leave, self.join, self.stranger = length, leave, join, stranger
        self.mixed, self.mixed_actions, self.box_actions = mixed, mixed_actions, box_actions

    @functools.cache  # noqa: B019 (PettingZoo's test wants the same object each call)
    def observation_space(self, agent: str) -> gym.Space:
        size = 3 if self.mixed and agent == "agent_0" else 2
        return gym.spaces.Box(0, 100, (size,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> gym.Space:
        if self.box_actions and agent == "agent_0":
            return gym.spaces.Box(0, 1, (1,), np.float32)
        return gym.spaces.Discrete(3 if self.mixed_actions and agent == "agent_0" else 2)

    def _obs(self, agent: str) -> np.ndarray:
        index = self.possible_agents.index(agent)
        size = self.observation_space(agent).shape[0]
        return np.array([index, self.t, 7][:size], np.float32)

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        if self.join:
            self.agents.remove("agent_0")
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        rewards = {a: float((self.possible_agents.index(a) + 1) * actions[a]) for a in actions}
        over = self.t >= self.length
        terms = {a: over or (self.leave and a == "agent_0") for a in actions}
        truncs = {a: False for a in actions}
        obs = {a: self._obs(a) for a in actions}
        self.agents = [a for a in self.agents if not terms[a]]
        if self.join and self.t == self.join and not over:
            self.agents.insert(0, "agent_0")
            obs["agent_0"] = self._obs("agent_0")
        if self.stranger and self.t == 1:
            self.agents.append("stranger")
        if self.fault == "shape":
            obs["agent_1"] = np.zeros(5, np.float32)
        elif self.fault == "nan":
            obs["agent_1"] = np.full(2, np.nan, np.float32)
        elif self.fault == "reward":
            rewards["agent_1"] = None
        elif self.fault == "missing":
            del obs["agent_1"]
        return obs, rewards, terms, truncs, {a: {} for a in actions}


def parallel_env(**kwargs) -> ScriptedGame:
    return ScriptedGame(**kwargs)
