"""The seams every agent and runtime share (Acme's, in PyTorch): the environment spec, the
``Actor`` / ``Learner`` / ``VariableSource`` / ``Adder`` / ``Worker`` / ``Builder`` protocols,
TensorFlow Agents' ``BatchedAlgorithm`` and the ``VariableClient``.

An agent is written once against these; runtimes (single, mono, ...) decide where the pieces run.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np


@dataclass(frozen=True)
class EnvSpec:
    """What an agent needs to know about an environment, derived from its Gymnasium spaces.

    ``action_kind`` is ``"discrete"`` (``num_actions`` choices), ``"multidiscrete"`` (one
    choice per entry of ``action_nvec``) or ``"continuous"`` (a box of ``action_shape`` between
    ``action_low`` and ``action_high``).
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
    action_nvec: tuple[int, ...] = ()

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
        if isinstance(action_space, gym.spaces.MultiDiscrete) and action_space.nvec.ndim == 1:
            nvec = tuple(int(n) for n in action_space.nvec)
            return cls(action_kind="multidiscrete", action_nvec=nvec, action_shape=(len(nvec),),
                       **common)  # fmt: skip
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
            "Discrete, MultiDiscrete or Box action spaces."
        )


@runtime_checkable
class VariableSource(Protocol):
    """Something that holds the current parameters (a learner, a parameter server)."""

    def get_variables(self, names: list[str]) -> list[dict[str, Any]]: ...


@runtime_checkable
class Learner(VariableSource, Protocol):
    """Consumes exactly one batch from its dataset per ``step()``; checkpointable."""

    def step(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class Actor(Protocol):
    """Acts in a batch of environments (leading dimension: environment; one env is B = 1).

    With next-step autoreset, a step whose environment was resetting is not a transition: the
    loop passes those environments as ``skip`` to ``observe`` and then calls ``observe_first``
    with their new first observation.
    """

    def select_action(self, obs: np.ndarray) -> np.ndarray: ...

    def observe_first(self, obs: np.ndarray, envs: np.ndarray) -> None: ...

    def observe(
        self,
        action: np.ndarray,
        reward: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        skip: np.ndarray,
        extras: dict[str, np.ndarray] | None = None,
    ) -> None: ...

    def update(self, wait: bool = False) -> None: ...


@runtime_checkable
class BatchedAlgorithm(Protocol):
    """TensorFlow Agents' batched algorithm interface (Hafner et al. 2017, section 5.1), which
    :func:`rlherd.run.loop.simulate` drives; indices are positions in the batch of environments.

    - ``begin_episodes(indices)``: these environments start episodes; their first observations
      come with the next ``perform``.
    - ``perform(obs) -> action``: batched inference for every environment.
    - ``experience(obs, action, reward, next_obs, terminated, truncated, skip)``: the batch of
      transitions just taken. With next-step autoreset, environments in ``skip`` only reset (their
      ``next_obs`` begins an episode): they are not transitions.
    - ``end_episodes(indices)``: these environments finished an episode at this step.

    :class:`rlherd.run.loop.ActorAlgorithm` is this interface made of an rlherd :class:`Actor`
    and :class:`Learner`, which is how every agent that acts step by step is driven.
    """

    def begin_episodes(self, indices: np.ndarray) -> None: ...

    def perform(self, obs: np.ndarray) -> np.ndarray: ...

    def experience(self, obs, action, reward, next_obs, terminated, truncated, skip) -> None: ...

    def end_episodes(self, indices: np.ndarray) -> None: ...


@runtime_checkable
class Adder(Protocol):
    """Turns one environment's steps into replay items (see :mod:`rlherd.replay.adders`)."""

    def add_first(self, obs: np.ndarray) -> None: ...

    def add(self, action, reward, next_obs, terminated, truncated, extras=None) -> None: ...


@runtime_checkable
class Worker(Protocol):
    """A node of a program (actor loop, learner loop, evaluator): runs until told to stop."""

    def run(self) -> None: ...


@runtime_checkable
class Builder(Protocol):
    """How an agent is assembled; runtimes call only these (Acme's builder)."""

    def make_networks(self, spec: EnvSpec, device: str | None = None) -> Any: ...

    def make_replay_tables(self, spec: EnvSpec) -> list[Any]: ...

    def make_dataset(self, tables: list[Any]) -> Any: ...

    def make_adder(self, tables: list[Any], num_envs: int) -> Any: ...

    def make_actor(self, networks: Any, adder: Any, seed: int) -> Actor: ...

    def make_learner(
        self, networks: Any, total_steps: int, dataset: Any = None, tables: Any = None
    ) -> Learner: ...

    def make_policy(self, networks: Any, evaluation: bool = True) -> Any: ...


class VariableClient:
    """Keeps ``module`` in sync with ``source``: ``update()`` fetches new parameters every
    ``update_period`` calls (or ``period_s`` seconds), in a background thread so acting does not
    wait; ``update(wait=True)`` fetches now and waits."""

    def __init__(
        self,
        source: VariableSource,
        module: Any,
        name: str = "policy",
        update_period: int = 1,
        period_s: float | None = None,
    ):
        self.source, self.module, self.name = source, module, name
        self.update_period, self.period_s = update_period, period_s
        self._calls = 0
        self._last = time.monotonic()
        self._pending: threading.Thread | None = None
        self._fetched: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def _fetch(self) -> None:
        (variables,) = self.source.get_variables([self.name])
        with self._lock:
            self._fetched = variables

    def _apply(self) -> None:
        with self._lock:
            fetched, self._fetched = self._fetched, None
        if fetched is not None:
            self.module.load_state_dict(fetched)

    def update(self, wait: bool = False) -> None:
        self._calls += 1
        self._apply()  # what the last background fetch brought
        if wait:
            if self._pending is not None:
                self._pending.join()
            self._fetch()
            self._apply()
            self._calls, self._last = 0, time.monotonic()
            return
        due = self._calls >= self.update_period or (
            self.period_s is not None and time.monotonic() - self._last >= self.period_s
        )
        if due and (self._pending is None or not self._pending.is_alive()):
            self._calls, self._last = 0, time.monotonic()
            self._pending = threading.Thread(target=self._fetch, daemon=True)
            self._pending.start()
