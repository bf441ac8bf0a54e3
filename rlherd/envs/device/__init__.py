"""Environments on a torch device (WarpDrive), their consistency checker, and fast sampling.

``make_device(env_id, num_envs, device, seed, **config)`` builds ``tag-gridworld``,
``tag-continuous`` or ``CartPole-v1``; :func:`check_consistency` holds a device environment to
its numpy reference; :func:`sample_categorical` (from :mod:`rlherd.networks.distributions`) draws
actions from logits on the device.
"""

from __future__ import annotations

import difflib
from typing import Any

import numpy as np
import torch

from rlherd.envs.device.base import DeviceEnv
from rlherd.envs.device.cartpole import CartPole
from rlherd.envs.device.tag import TagContinuous, TagGridWorld
from rlherd.errors import ConfigError
from rlherd.networks.distributions import sample_categorical, sample_multi_categorical

DEVICE_ENVS: dict[str, type[DeviceEnv]] = {
    "tag-gridworld": TagGridWorld,
    "tag-continuous": TagContinuous,
    "CartPole-v1": CartPole,
}


def make_device(
    env_id: str, num_envs: int, device: str = "cpu", seed: int = 0, **config: Any
) -> DeviceEnv:
    if env_id not in DEVICE_ENVS:
        close = difflib.get_close_matches(env_id, list(DEVICE_ENVS), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"{env_id!r} has no device version; device environments: "
            f"{', '.join(DEVICE_ENVS)}.{hint}"
        )
    try:
        return DEVICE_ENVS[env_id](num_envs, device=device, seed=seed, **config)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"bad option for {env_id}: {e}") from None


# ---------------------------------------------------------------------------- consistency
class ConsistencyError(AssertionError):
    """A device environment disagreed with its reference."""


class _ParallelAdapter:
    """A PettingZoo ``ParallelEnv`` reference seen as arrays in agent-index order."""

    def __init__(self, env):
        self.env, self.names = env, env.possible_agents

    def set_state(self, state: dict[str, np.ndarray]) -> np.ndarray:
        self.env.reset()
        return np.asarray(self.env.set_state(state))

    def step(self, actions: np.ndarray):
        obs, rewards, terminated, truncated, _ = self.env.step(
            {a: actions[i] for i, a in enumerate(self.names)}
        )
        return (
            np.stack([obs[a] for a in self.names]),
            np.array([rewards[a] for a in self.names]),
            any(terminated.values()),
            any(truncated.values()),
        )


def _reference(env: DeviceEnv):
    ref = env.reference()
    return _ParallelAdapter(ref) if hasattr(ref, "possible_agents") else ref


def _compare(what: str, step: int, env: DeviceEnv, i: int, device, reference, tol: float):
    device, reference = np.asarray(device, np.float64), np.asarray(reference, np.float64)
    if device.shape != reference.shape:
        raise ConsistencyError(
            f"step {step}, environment {i}: {what} shapes differ: device {device.shape}, "
            f"reference {reference.shape}"
        )
    diff = np.abs(device - reference)
    bad = (diff > tol) & (diff > tol * np.abs(reference))
    if bad.any():
        index = tuple(int(k) for k in np.argwhere(bad)[0])
        agent = env.agent_names[index[0]]
        where = f"[{index[1]}]" if len(index) > 1 else ""
        raise ConsistencyError(
            f"step {step}, environment {i}, agent {agent!r}: {what}{where} is "
            f"{device[index]:.6g} on the device but {reference[index]:.6g} in the reference"
        )


def check_consistency(
    env: DeviceEnv,
    steps: int = 300,
    seed: int = 0,
    tolerance: float = 0.01,
    progress=None,
) -> dict[str, int]:
    """Step ``env`` and one reference game per environment with identical start states and
    actions; compare observations and rewards (within ``tolerance``, absolute or relative, as
    WarpDrive) and done flags (exactly) at every step, through autoresets. Raises
    :class:`ConsistencyError` naming the step, environment, agent, field and both values;
    returns counts of steps and episodes checked."""
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    refs = [_reference(env) for _ in range(env.num_envs)]
    for i, ref in enumerate(refs):
        _compare("observation", 0, env, i, env.obs[i].cpu(), ref.set_state(env.game_state(i)),
                 tolerance)  # fmt: skip
    done = np.zeros(env.num_envs, dtype=bool)
    episodes = 0
    for t in range(1, steps + 1):
        actions = env.sample_actions(rng)
        obs, reward, terminated, truncated = (x.cpu().numpy() for x in env.step(
            torch.as_tensor(actions, device=env.device)))  # fmt: skip
        for i, ref in enumerate(refs):
            if done[i]:  # next-step autoreset: the device game restarted; so does its reference
                expected_obs = ref.set_state(env.game_state(i))
                _compare("observation (after autoreset)", t, env, i, obs[i], expected_obs,
                         tolerance)  # fmt: skip
                if reward[i].any() or terminated[i] or truncated[i]:
                    raise ConsistencyError(
                        f"step {t}, environment {i}: an autoreset step must have reward 0 and "
                        "no flags"
                    )
                continue
            ref_obs, ref_reward, ref_terminated, ref_truncated = ref.step(actions[i])
            _compare("observation", t, env, i, obs[i], ref_obs, tolerance)
            _compare("reward", t, env, i, reward[i], ref_reward, tolerance)
            for name, a, b in (("terminated", terminated[i], ref_terminated),
                               ("truncated", truncated[i], ref_truncated)):  # fmt: skip
                if bool(a) != bool(b):
                    raise ConsistencyError(
                        f"step {t}, environment {i}: {name} is {bool(a)} on the device but "
                        f"{bool(b)} in the reference"
                    )
        done = terminated | truncated
        episodes += int(done.sum())
        if progress is not None:
            progress(t)
    return dict(steps=steps, environments=env.num_envs, episodes=episodes)


__all__ = [
    "DEVICE_ENVS",
    "CartPole",
    "ConsistencyError",
    "DeviceEnv",
    "TagContinuous",
    "TagGridWorld",
    "check_consistency",
    "make_device",
    "sample_categorical",
    "sample_multi_categorical",
]
