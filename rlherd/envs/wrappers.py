"""The wrappers :func:`rlherd.envs.make` puts around environments that need them. The first two
make every agent and runtime see observations one way: an array, or a flat dict of named arrays
whose ``action_mask`` (where the environment has one) says which actions are legal.

- :class:`NamedArrays`: nested ``Dict`` / ``Tuple`` observations as one level of named arrays
  (keys joined by ``"."``), a ``Discrete``, ``MultiDiscrete`` or ``MultiBinary`` alone as such a
  dict of one array (``"observation"``), codes counted from 0, a scalar ``Box`` as a vector of
  one, and leaves that are not
  arrays (MiniGrid's ``mission`` text) left out (:func:`rlherd.core.flatten_space`).
- :class:`ActionMaskObservation`: an action mask that the environment hands out in
  ``info["action_mask"]`` (Gymnasium's toy text) or through ``action_masks()`` (MaskablePPO's
  convention) moved into the observation as ``obs["action_mask"]``, PettingZoo's convention.
  An array observation becomes ``{"observation": ..., "action_mask": ...}``.
- :class:`MaskCheck`: every step's action mask checked (one entry per action, each 0 or 1, some
  action legal until the episode ends), and a mask that appears in ``info`` only after reset
  refused: either would have the agents play illegal actions in silence.
- :class:`ActionRepeat`: each action held for ``n`` steps of the environment, their rewards
  summed (the Control Suite's ``action_repeat`` option, the convention of its pixel and state
  benchmarks).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlherd.core import OBS_KEY, flatten_space, flatten_value
from rlherd.errors import UnsupportedEnv
from rlherd.types import ACTION_MASK


class NamedArrays(gym.ObservationWrapper):
    """See the module docstring. ``dropped`` lists the keys left out."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space, self.dropped = flatten_space(env.observation_space)

    def observation(self, observation: Any) -> Any:
        return flatten_value(self.env.observation_space, observation)


class ActionMaskObservation(gym.Wrapper):
    """See the module docstring; ``source`` is ``"info"`` or ``"method"``."""

    def __init__(self, env: gym.Env, source: str):
        super().__init__(env)
        if source not in ("info", "method"):
            raise ValueError(f"source must be 'info' or 'method', got {source!r}")
        self.source = source
        n = int(env.action_space.n)
        mask = gym.spaces.MultiBinary(n)
        space = env.observation_space
        leaves = dict(space.spaces) if isinstance(space, gym.spaces.Dict) else {OBS_KEY: space}
        self.observation_space = gym.spaces.Dict({**leaves, ACTION_MASK: mask})
        self._wrap = not isinstance(space, gym.spaces.Dict)

    def _with_mask(self, obs: Any, info: dict[str, Any]) -> dict[str, Any]:
        if self.source == "info":
            mask = info[ACTION_MASK]
        else:
            mask = self.env.get_wrapper_attr("action_masks")()
        obs = {OBS_KEY: np.asarray(obs)} if self._wrap else dict(obs)
        obs[ACTION_MASK] = np.asarray(mask, dtype=np.int8)
        return obs

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        return self._with_mask(obs, info), info

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._with_mask(obs, info), reward, terminated, truncated, info


class MaskCheck(gym.Wrapper):
    """See the module docstring. ``masked``: the observation holds an action mask, to check at
    every step; otherwise a mask in a step's ``info`` (never seen at reset, so never read) is
    refused."""

    def __init__(self, env: gym.Env, env_id: str, masked: bool):
        super().__init__(env)
        self.env_id, self.masked = env_id, masked

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self._check(obs, info, ended=False)
        return obs, info

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._check(obs, info, ended=terminated or truncated)
        return obs, reward, terminated, truncated, info

    def _check(self, obs: Any, info: dict[str, Any], ended: bool) -> None:
        if not self.masked:
            if ACTION_MASK in info:
                raise UnsupportedEnv(f"{self.env_id} gives info['action_mask'] from step() but "
                                     "not from reset(), so it would be ignored: give it from "
                                     "reset() too")  # fmt: skip
            return
        mask, n = np.asarray(obs[ACTION_MASK]), int(self.action_space.n)
        if mask.shape != (n,) or not np.isin(mask, (0, 1)).all():
            raise UnsupportedEnv(f"{self.env_id}'s action mask {mask.tolist()} is not one 0 or "
                                 f"1 per action ({n}); 1 marks a legal action")  # fmt: skip
        if not ended and not mask.any():
            raise UnsupportedEnv(f"{self.env_id}'s action mask allows no action mid-episode; "
                                 "end the episode (terminated) when no action is legal")


def mask_source(env: gym.Env, probe_info: dict[str, Any] | None) -> str | None:
    """Where ``env``'s action mask comes from, if it has one outside its observation:
    ``"method"`` (``action_masks()``), ``"info"`` (``info["action_mask"]`` at reset), or None.
    A mask already in a dict observation needs nothing."""
    space = env.observation_space
    if isinstance(space, gym.spaces.Dict) and ACTION_MASK in space.spaces:
        return None
    if not isinstance(env.action_space, gym.spaces.Discrete):
        return None
    try:  # on the environment or on a wrapper of it (sb3-contrib's ActionMasker)
        if callable(env.get_wrapper_attr("action_masks")):
            return "method"
    except AttributeError:
        pass
    if probe_info is not None and ACTION_MASK in probe_info:
        return "info"
    return None


def sample_action(space: gym.Space, obs: Any) -> Any:
    """A uniformly random action from ``space`` (with its own random stream), among the legal
    ones where ``obs`` has an action mask."""
    mask = obs.get(ACTION_MASK) if isinstance(obs, dict) else None
    if mask is None:
        return space.sample()
    return space.sample(mask=np.asarray(mask, dtype=np.int8))


class ActionRepeat(gym.Wrapper):
    """Each action held for ``repeat`` steps of the wrapped environment (fewer where its episode
    ends first), their rewards summed: one step here is ``repeat`` there, as in the Control
    Suite benchmarks that report environment steps with an action repeat."""

    def __init__(self, env: gym.Env, repeat: int):
        super().__init__(env)
        self.repeat = repeat

    def step(self, action: Any):
        total = 0.0
        for _ in range(self.repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info
