"""The seams every agent and runtime share: the environment spec and the learner protocols.

An agent is written once against these; runtimes (single, mono, ...) decide where the pieces run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np


@dataclass(frozen=True)
class EnvSpec:
    """What an agent needs to know about an environment, derived from its Gymnasium spaces.

    ``action_kind`` is ``"discrete"`` (``num_actions`` choices) or ``"continuous"`` (a box of
    ``action_shape`` between ``action_low`` and ``action_high``).
    """

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    action_kind: str
    num_actions: int = 0
    action_shape: tuple[int, ...] = ()
    action_low: np.ndarray | None = None
    action_high: np.ndarray | None = None
    max_episode_steps: int | None = None

    @property
    def is_image(self) -> bool:
        """Images are ``[C, H, W]`` (channels first), usually uint8."""
        return len(self.obs_shape) == 3

    @classmethod
    def from_spaces(
        cls,
        env_id: str,
        observation_space: gym.Space,
        action_space: gym.Space,
        max_episode_steps: int | None = None,
    ) -> EnvSpec:
        if not isinstance(observation_space, gym.spaces.Box):
            raise TypeError(
                f"{env_id}: observation space {observation_space!r} is not supported; rlherd "
                "agents read Box observations. Flatten it first, e.g. with "
                "gymnasium.wrappers.FlattenObservation."
            )
        common = dict(
            env_id=env_id,
            obs_shape=tuple(observation_space.shape),
            obs_dtype=np.dtype(observation_space.dtype),
            max_episode_steps=max_episode_steps,
        )
        if isinstance(action_space, gym.spaces.Discrete):
            if int(action_space.start) != 0:
                raise TypeError(
                    f"{env_id}: action space {action_space!r} starts at {action_space.start}; "
                    "rlherd expects Discrete(n) actions numbered from 0."
                )
            return cls(action_kind="discrete", num_actions=int(action_space.n), **common)
        if isinstance(action_space, gym.spaces.Box):
            return cls(
                action_kind="continuous",
                action_shape=tuple(action_space.shape),
                action_low=np.asarray(action_space.low),
                action_high=np.asarray(action_space.high),
                **common,
            )
        raise TypeError(
            f"{env_id}: action space {action_space!r} is not supported; rlherd agents act in "
            "Discrete or Box action spaces."
        )


@runtime_checkable
class VariableSource(Protocol):
    """Something that holds the current parameters (a learner, a parameter server)."""

    def get_variables(self, names: list[str]) -> list[dict[str, Any]]: ...


@runtime_checkable
class Learner(VariableSource, Protocol):
    """Consumes exactly one batch per ``step()`` and is checkpointable."""

    def step(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
