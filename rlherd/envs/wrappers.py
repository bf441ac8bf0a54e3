"""The wrappers :func:`rlherd.envs.make` puts around environments that need them. The first two
make every agent and runtime see observations one way: an array, or a flat dict of named arrays
whose ``action_mask`` (where the environment has one) says which actions are legal.

- :class:`NamedArrays`: nested ``Dict`` / ``Tuple`` observations as one level of named arrays
  (keys joined by ``"."``), a ``Discrete``, ``MultiDiscrete`` or ``MultiBinary`` alone as such a
  dict of one array (``"observation"``), codes counted from 0, a scalar ``Box`` as a vector of
  one, and leaves that are not arrays (MiniGrid's ``mission`` text) left out
  (:func:`rlherd.core.flatten_space`).
- :class:`ActionMaskObservation`: an action mask that the environment hands out in
  ``info["action_mask"]`` (Gymnasium's toy text) or through ``action_masks()`` (MaskablePPO's
  convention) moved into the observation as ``obs["action_mask"]``, PettingZoo's convention.
  An array observation becomes ``{"observation": ..., "action_mask": ...}``.
- :class:`ApiCheck`: an environment of one's own held to Gymnasium's API (``reset()`` takes
  ``seed=`` and ``options=`` and gives ``(observation, info)``, ``step()`` five values),
  innermost, so that the old Gym API's calls and returns are one line rather than a TypeError
  or a failed unpacking inside another wrapper.
- :class:`StepCheck`: an environment of one's own checked at every step, so that a fault of
  its own is one line naming it rather than numpy's error deep in a batch, a divergence blamed
  on the learning rate, or illegal actions played in silence: each observation array of its
  space's shape and finite, each code one of its space's, the reward a finite number, and the
  action mask one 0 or 1 per action with some action legal until the episode ends (a mask that
  appears in ``info`` only after reset, never read, is refused).
- :class:`ActionRepeat`: each action held for ``n`` steps of the environment, their rewards
  summed (the Control Suite's ``action_repeat`` option, the convention of its pixel and state
  benchmarks).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlherd.core import OBS_KEY, Leaf, flatten_space, flatten_value, unmasked
from rlherd.errors import UnsupportedEnv
from rlherd.types import ACTION_MASK


class NamedArrays(gym.ObservationWrapper):
    """See the module docstring. ``dropped`` lists the keys left out; ``env_id`` names the
    environment in the line that refuses a space it cannot carry."""

    def __init__(self, env: gym.Env, env_id: str):
        super().__init__(env)
        self.observation_space, self.dropped = flatten_space(env.observation_space, f"{env_id}'s")

    def observation(self, observation: Any) -> Any:
        return flatten_value(self.env.observation_space, observation)


class ActionMaskObservation(gym.Wrapper):
    """See the module docstring; ``source`` is ``"info"`` or ``"method"``; ``env_id`` names the
    environment in the line that refuses an ``info`` without the mask after a reset that gave
    one."""

    def __init__(self, env: gym.Env, source: str, env_id: str):
        super().__init__(env)
        if source not in ("info", "method"):
            raise ValueError(f"source must be 'info' or 'method', got {source!r}")
        self.source, self.env_id = source, env_id
        n = int(env.action_space.n)
        mask = gym.spaces.MultiBinary(n)
        space = env.observation_space
        leaves = dict(space.spaces) if isinstance(space, gym.spaces.Dict) else {OBS_KEY: space}
        self.observation_space = gym.spaces.Dict({**leaves, ACTION_MASK: mask})
        self._wrap = not isinstance(space, gym.spaces.Dict)

    def _with_mask(self, obs: Any, info: dict[str, Any]) -> dict[str, Any]:
        if self.source == "info":
            mask = info.get(ACTION_MASK)
            if mask is None:
                raise UnsupportedEnv(f"{self.env_id} gives info['action_mask'] from reset() but "
                                     "not with every observation after it: give it from every "
                                     "step(), the final one too")  # fmt: skip
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


class StepCheck(gym.Wrapper):
    """See the module docstring. ``masked``: the observation holds an action mask, to check at
    every step; otherwise, with ``late_masks`` (the reset's ``info`` was looked at), a mask in a
    discrete environment's step ``info`` is refused."""

    def __init__(self, env: gym.Env, env_id: str, masked: bool, late_masks: bool = True):
        super().__init__(env)
        self.env_id, self.masked = env_id, masked
        self.late_masks = late_masks and isinstance(env.action_space, gym.spaces.Discrete)
        self.shapes = leaf_shapes(env.observation_space)
        self.codes = leaf_codes(env.observation_space)

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self._check(obs, info, "reset()", ended=False)
        return obs, info

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if not one_finite_number(reward):
            raise UnsupportedEnv(f"{self.env_id}'s step() returned the reward {reward!r}; a "
                                 "reward is one finite number")  # fmt: skip
        self._check(obs, info, "step()", ended=terminated or truncated)
        return obs, reward, terminated, truncated, info

    def _check(self, obs: Any, info: dict[str, Any], call: str, ended: bool) -> None:
        check_observation(obs, self.shapes, f"{self.env_id}'s {call}", codes=self.codes)
        if self.masked:
            check_mask(np.asarray(obs[ACTION_MASK]), int(self.action_space.n), self.env_id,
                       ended)  # fmt: skip
        elif self.late_masks and ACTION_MASK in info:
            raise UnsupportedEnv(f"{self.env_id} gives info['action_mask'] from step() but "
                                 "not from reset(), so it would be ignored: give it from "
                                 "reset() too")  # fmt: skip


def leaf_shapes(space: gym.Space) -> dict[str | None, tuple[int, ...]]:
    """The shape of each array an observation of ``space`` holds, by its key (None: the
    observation is one array), as :func:`check_observation` reads them; spaces with no one
    shape (a ``Tuple``, a nested ``Dict``) are left out."""
    leaves = space.spaces if isinstance(space, gym.spaces.Dict) else {None: space}
    return {k: s.shape for k, s in leaves.items() if s.shape is not None}


def leaf_codes(space: gym.Space) -> dict[str, int | np.ndarray]:
    """How many codes each array of an observation of ``space`` (flattened: counted from 0) that
    networks may read as codes has, by its key, as :func:`check_observation` reads them: a
    ``Discrete``'s (an int), a ``MultiDiscrete``'s (one per entry) and an integer ``Box``'s with
    bounds in ``[0, n)`` (its :class:`~rlherd.core.Leaf` categories) where its dtype can hold
    more (a uint8 image's 256 it cannot). An action mask has its own check (:func:`check_mask`)."""
    leaves = space.spaces if isinstance(space, gym.spaces.Dict) else {}
    codes: dict[str, int | np.ndarray] = {}
    for key, leaf_space in leaves.items():
        if key == ACTION_MASK:
            continue
        if isinstance(leaf_space, gym.spaces.MultiDiscrete):
            codes[key] = leaf_space.nvec
        elif isinstance(leaf_space, gym.spaces.Discrete | gym.spaces.Box):
            leaf = Leaf.of(leaf_space)
            if leaf.categories and np.iinfo(leaf.dtype).max >= leaf.categories:
                codes[key] = leaf.categories
    return codes


def check_observation(obs: Any, shapes: dict[str | None, tuple[int, ...]], where: str,
                      whose: str = "", codes: dict[str, int | np.ndarray] | None = None) -> None:
    """An environment's own observation held to its space (``shapes``, :func:`leaf_shapes`;
    ``codes``, :func:`leaf_codes`): each array there, of its shape, finite, and each code one
    of its space's. A fault is one line saying ``where`` it came from (``"MyEnv-v0's step()"``)
    and ``whose`` (``" for player_1"``), not numpy's error inside a batch, torch's inside a
    one-hot, or a network's NaN blamed on the learning rate."""
    for key, shape in shapes.items():  # every key is there: ApiCheck or FlatView.flat saw to it
        value = np.asarray(obs if key is None else obs[key])
        if value.shape != shape:
            raise UnsupportedEnv(f"{where} returned {_leaf(key)}{whose} of shape "
                                 f"{value.shape}; its observation space says {shape}")
        if value.dtype.kind == "f" and not np.isfinite(value).all():  # not the learner's
            raise UnsupportedEnv(f"{where} returned {_leaf(key)}{whose} holding NaN or inf, "
                                 "which no network reads, even where its space's bounds allow "
                                 "inf: replace them (a gymnasium.wrappers.TransformObservation)")
    for key, n in (codes or {}).items():
        value = np.asarray(obs[key])  # a Discrete's in Python's ints: 4x numpy's speed
        if 0 <= int(value) < n if value.ndim == 0 else not ((value < 0) | (value >= n)).any():
            continue
        outside = np.unique(value[(value < 0) | (value >= n)])[:5].tolist()
        raise UnsupportedEnv(f"{where} returned {_leaf(key)}{whose} holding {outside}, outside "
                             f"the codes its space declares (below {np.asarray(n).tolist()}, "
                             "a Discrete's counted from its start), which no one-hot or "
                             "embedding reads")


def check_mask(mask: np.ndarray, n: int, name: str, ended: bool, whose: str = "") -> None:
    """An action mask of one's own: one 0 or 1 for each of ``n`` actions, one of them legal
    unless the episode ``ended``; ``name`` is the environment's, ``whose`` the agent's
    (``" for player_1"``)."""
    if mask.shape != (n,) or ((mask != 0) & (mask != 1)).any():  # np.isin: 5x the time
        raise UnsupportedEnv(f"{name}'s action mask{whose} {mask.tolist()} is not one 0 or 1 "
                             f"per action ({n}); 1 marks a legal action")  # fmt: skip
    if not ended and not mask.any():
        raise UnsupportedEnv(f"{name}'s action mask{whose} allows no action mid-episode; end "
                             "the episode (terminated) when no action is legal")


class FlatView:
    """A game of one's own's observations as the policy reads them (flattened,
    :func:`rlherd.core.flatten_space`), held to its space: every array, nested ones too, there
    (:meth:`flat`), of its shape and finite (:meth:`check`). A fault is one line saying
    ``where`` the observation came from and ``whose`` it is (:func:`check_observation`);
    ``game`` names the game in the line that refuses a space it cannot carry."""

    def __init__(self, space: gym.Space, game: str):
        self.space = space
        flat = flatten_space(space, f"{game}'s")[0]
        self.shapes, self.codes = leaf_shapes(flat), leaf_codes(flat)

    def flat(self, obs: Any, where: str, whose: str = "") -> Any:
        try:
            return flatten_value(self.space, obs)
        except KeyError as e:  # a Dict's key the observation lacks
            raise UnsupportedEnv(f"{where} returned an observation{whose} without "
                                 f"{e.args[0]!r}, which its observation space has") from None

    def check(self, flat: Any, where: str, whose: str = "") -> None:
        check_observation(flat, self.shapes, where, whose, self.codes)


class ApiCheck(gym.Wrapper):
    """An environment of one's own held to Gymnasium's API, innermost, before any wrapper
    unpacks what it returns: ``reset()`` takes ``seed=`` and ``options=`` (every vector env
    passes both) and gives ``(observation, info)``, ``step()`` five values whose info is a
    dict. The old Gym API's (a ``reset()`` of no arguments, an observation alone, four values
    with one ``done``) and an info of None are one line naming the environment and the fix."""

    def __init__(self, env: gym.Env, env_id: str):
        super().__init__(env)
        self.env_id = env_id
        self._dict = isinstance(env.observation_space, gym.spaces.Dict)

    def reset(self, **kwargs: Any):
        try:
            result = self.env.reset(**kwargs)
        except TypeError:
            if _takes(self.env.reset, kwargs):
                raise  # raised inside: the environment's own bug
            taken = ", ".join(f"{name}=" for name in kwargs)
            raise UnsupportedEnv(f"{self.env_id}'s reset() does not take {taken} as "
                                 "Gymnasium's does: define it as reset(self, *, seed=None, "
                                 "options=None), calling super().reset(seed=seed)") from None
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
            if self._dict:
                self._check_keys(result[0], self.observation_space, "reset()")
            return result
        raise UnsupportedEnv(f"{self.env_id}'s reset() returned {_count(result)}, not "
                             "Gymnasium's (observation, info): return an info dict too")

    def step(self, action: Any):
        result = self.env.step(action)
        if isinstance(result, tuple) and len(result) == 5:
            if not isinstance(result[4], dict):  # every wrapper and vector env reads it as one
                raise UnsupportedEnv(f"{self.env_id}'s step() returned the info "
                                     f"{result[4]!r:.60}, not a dict: return {{}} where there is "
                                     "nothing to say")  # fmt: skip
            if self._dict:
                self._check_keys(result[0], self.observation_space, "step()")
            return result
        raise UnsupportedEnv(f"{self.env_id}'s step() returned {_count(result)}, not "
                             "Gymnasium's (observation, reward, terminated, truncated, info): "
                             "the old Gym API's done is two flags now (gymnasium.utils."
                             "step_api_compatibility converts)")  # fmt: skip

    def _check_keys(self, obs: Any, space: gym.spaces.Dict, call: str, path: str = "") -> None:
        """Every key of a ``Dict`` space, nested ones too, in the observation: the view that
        flattens it would fail on the first one missing with a bare ``KeyError``."""
        for key, sub in space.spaces.items():
            name = f"{path}{key}"  # keys need not be strings
            if not isinstance(obs, Mapping) or key not in obs:
                raise UnsupportedEnv(f"{self.env_id}'s {call} returned an observation without "
                                     f"{name!r}, which its observation space has")
            if isinstance(sub, gym.spaces.Dict):
                self._check_keys(obs[key], sub, call, f"{name}.")


def _takes(method: Any, kwargs: dict[str, Any]) -> bool:
    """Whether ``method`` can be called with ``kwargs`` (a method without a signature to read is
    given the benefit of the doubt)."""
    try:
        inspect.signature(method).bind(**kwargs)
    except TypeError:
        return False
    except ValueError:  # no signature to read
        pass
    return True


def _count(result: Any) -> str:
    """What an environment returned, as a message names it: ``4 values``, ``a dict``."""
    if isinstance(result, tuple):
        return f"{len(result)} values"
    name = type(result).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _leaf(key: str | None) -> str:
    """How a message names an observation's array (``key`` None: the observation itself)."""
    return "an observation" if key is None else f"observation {key!r}"


def one_finite_number(reward: Any) -> bool:
    """Whether ``reward`` is one finite number; a Python (or numpy float64) float the quick way,
    as most are: this runs at every step."""
    if isinstance(reward, float | int):
        return math.isfinite(reward)
    try:
        return np.ndim(reward) == 0 and bool(np.isfinite(reward))
    except TypeError:  # None, a string: no number at all
        return False


def mask_source(env: gym.Env, env_id: str, probe_info: dict[str, Any] | None) -> str | None:
    """Where ``env``'s action mask comes from, if it has one outside its observation:
    ``"method"`` (``action_masks()``), ``"info"`` (``info["action_mask"]`` at reset), or None.
    A mask already in a dict observation needs nothing. A method of actions other than
    ``Discrete`` (MaskablePPO's of MultiDiscrete ones) is refused, naming ``env_id``."""
    space = env.observation_space
    if isinstance(space, gym.spaces.Dict) and ACTION_MASK in space.spaces:
        return None
    try:  # on the environment or on a wrapper of it (sb3-contrib's ActionMasker)
        method = callable(env.get_wrapper_attr("action_masks"))
    except AttributeError:
        method = False
    if method:
        unmasked(env_id, "its action_masks()", env.action_space)
        return "method"
    if not isinstance(env.action_space, gym.spaces.Discrete):
        return None
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
