"""The environment loop: an :class:`~rlherd.core.Actor` stepping a batch of environments.

It follows Gymnasium's next-step autoreset: the step after an episode ended only resets that
environment, so it is not observed as a transition; the actor gets ``observe_first`` with the new
episode's first observation instead. Episode returns and lengths and step counts go to the run's
recorder.
"""

from __future__ import annotations

import pickle
from typing import Any

import gymnasium as gym
import numpy as np

from rlherd.core import Actor
from rlherd.envs import save_envs
from rlherd.run.recorder import Recorder


class EnvironmentLoop:
    def __init__(self, envs: gym.vector.VectorEnv, actor: Actor, recorder: Recorder, seed: int):
        self.envs, self.actor, self.recorder = envs, actor, recorder
        obs, _ = envs.reset(seed=seed)
        self.obs = np.asarray(obs)
        n = envs.num_envs
        self.resetting = np.zeros(n, dtype=bool)  # this env's next step is an autoreset
        self.episode_return = np.zeros(n)
        self.episode_length = np.zeros(n, dtype=np.int64)
        actor.observe_first(self.obs, np.ones(n, dtype=bool))

    def step(self) -> int:
        """One step of every environment; returns the number of agent steps taken."""
        action = self.actor.select_action(self.obs)
        obs, reward, terminated, truncated, _ = self.envs.step(action)
        obs = np.asarray(obs)
        reward = np.asarray(reward, dtype=np.float64)
        terminated, truncated = np.asarray(terminated), np.asarray(truncated)
        skip = self.resetting
        self.actor.observe(action, reward, obs, terminated, truncated, skip=skip)
        if skip.any():
            self.actor.observe_first(obs, skip)
        self.episode_return = np.where(skip, 0.0, self.episode_return + reward)
        self.episode_length = np.where(skip, 0, self.episode_length + 1)
        ended = (terminated | truncated) & ~skip
        if ended.any():
            self.recorder.episodes(self.episode_return[ended], self.episode_length[ended])
        self.resetting = ended
        self.obs = obs
        n = len(skip)  # every environment step counts, autoresets included (as TorchBeast)
        self.recorder.add_actor_steps(n)
        return n

    def state_dict(self) -> dict[str, Any]:
        keys = ("obs", "resetting", "episode_return", "episode_length")
        return dict(envs=save_envs(self.envs), **{k: getattr(self, k) for k in keys})

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; False if the environments could not be saved (episodes restart)."""
        if state["envs"] is None:
            return False
        self.envs.close()
        self.envs = pickle.loads(state["envs"])
        for k, v in state.items():
            if k != "envs":
                setattr(self, k, v)
        return True
