"""The seams every agent and runtime share (Acme's, in PyTorch): the environment spec, the
``Actor`` / ``Learner`` / ``VariableSource`` / ``Adder`` / ``Worker`` / ``Builder`` protocols,
TensorFlow Agents' ``BatchedAlgorithm`` and the ``VariableClient``.

An agent is written once against these; runtimes (single, mono, ...) decide where the pieces run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np

from rlherd.run.config import UnsupportedEnv

if TYPE_CHECKING:  # environment workers import this module without torch
    import torch


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
            raise UnsupportedEnv(
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
                raise UnsupportedEnv(
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
        raise UnsupportedEnv(
            f"{env_id}: action space {action_space!r} is not supported; rlherd agents act in "
            "Discrete, MultiDiscrete or Box action spaces."
        )


@runtime_checkable
class VariableSource(Protocol):
    """Something that holds the current parameters (a learner, shared memory, a remote learner).

    ``get_variables(names)`` returns one state dict per name. A source may also define
    ``variables_version() -> int`` (it grows whenever the variables change), which lets a
    :class:`VariableClient` skip fetching what it already has; a source that answers
    asynchronously (with variables older than the version it reported) says which version it
    returned as ``fetched_version``, so the client asks again.
    """

    def get_variables(self, names: list[str]) -> list[dict[str, Any]]: ...


@runtime_checkable
class Learner(VariableSource, Protocol):
    """Consumes exactly one batch from its dataset per ``step()``; checkpointable. Runtimes drive
    learners only through ``step()``."""

    def step(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class Policy(Protocol):
    """Batched inference: the part of acting a runtime may move (poly's dynamic batcher, a GPU).

    ``policy(obs [B, ...], first [B], state, generator) -> (outputs, new_state)``: ``first[b]``
    marks observations that begin an episode (recurrent state is zeroed there); ``outputs`` is a
    dict of ``[B, ...]`` tensors holding at least ``action`` and whatever else the agent stores
    in its rollouts or needs to act (logits, values, Q-values). Random draws use ``generator``,
    so the caller decides whose random stream acting consumes. Feed-forward policies have
    ``initial_state(B) == ()``.
    """

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]: ...

    def __call__(
        self,
        obs: torch.Tensor,
        first: torch.Tensor,
        state: tuple[torch.Tensor, ...],
        generator: torch.Generator | None,
    ) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...]]: ...


@runtime_checkable
class Actor(Protocol):
    """Acts in a batch of environments (leading dimension: environment; one env is B = 1).

    With next-step autoreset, a step whose environment was resetting is not a transition: the
    loop passes those environments as ``skip`` to ``observe`` and then calls ``observe_first``
    with their new first observation.

    An actor that plans with the environments themselves (MCTS's simulator) also defines
    ``bind_environments(envs)``: the loop hands it the ``gymnasium.Env`` of each row, or None
    where they live in other processes.
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
    """How an agent is assembled (Acme's builder): what every runtime may call, and nothing else.

    ``dataflow`` says which of the two protocols below the builder also follows: ``"replay"``
    (:class:`ReplayBuilder`) or ``"rollout"`` (:class:`RolloutBuilder`). ``make_actor`` gets its
    parameters only through ``variable_source`` (the learner in one process, shared memory in
    ``mono``, a remote learner later); ``None`` means the policy's own parameters are current
    (poly's batched policy, an evaluator given a fixed network).
    """

    name: str
    dataflow: str
    config: Any

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> Any: ...

    def make_policy(self, networks: Any, evaluation: bool = False) -> Policy: ...

    def make_actor(
        self,
        seed: int,
        policy: Policy,
        spec: EnvSpec,
        adder: Any,
        variable_source: VariableSource | None,
    ) -> Actor: ...

    def make_learner(
        self, networks: Any, dataset: Any, total_steps: int, tables: list[Any] | None = None
    ) -> Learner: ...


@runtime_checkable
class ReplayBuilder(Builder, Protocol):
    """Replay agents (DQN, R2D2, D4PG, ...): actors write through an adder into tables that the
    runtime places (in the learner's process, reached across processes, or as a service); the
    learner reads a dataset made from those tables."""

    def make_replay_tables(
        self, spec: EnvSpec, insert_blocking: bool = True, dataset_size: int | None = None
    ) -> list[Any]:
        """The tables actors write into. ``insert_blocking=False``: inserts never wait (one
        process). ``dataset_size``: the tables will hold a fixed dataset of that many steps
        (the offline runtime): room for all of it, and samples never limited."""
        ...

    def make_adder(self, tables: list[Any], num_envs: int) -> Adder: ...

    def make_dataset(self, tables: list[Any], device: str = "cpu") -> Any: ...


@runtime_checkable
class RolloutBuilder(Builder, Protocol):
    """On-policy agents (IMPALA, PPO, A2C): the builder declares the fields its actor writes per
    row (``rollout_fields``; names from :mod:`rlherd.types`), and the runtime owns the
    ``[T + 1, B]`` buffers the actor fills through a :class:`rlherd.replay.rollouts.RolloutWriter`
    (a queue in one process, shared-memory slots, a batching queue, device tensors). The learner's
    dataset yields batches of ``batch_size`` environments' rollouts of ``unroll_length`` steps."""

    unroll_length: int
    batch_size: int

    def rollout_fields(self, spec: EnvSpec) -> dict[str, tuple[tuple[int, ...], Any]]: ...

    def actor_only_features(self) -> list[str]:
        """The config fields in use whose work the actor does beyond its policy (PPO's reward
        scaling): a runtime that acts with the policy alone (``device``) refuses them."""
        ...


def copy_tensors(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """``d.copy_(s)`` for each pair, as one foreach call where the two lists share a device:
    ``load_state_dict`` walks the module and checks each tensor, which costs a small network's
    actor more than the copy (a D4PG Pendulum run fetches after every environment step)."""
    import torch  # here: environment workers import this module without torch

    with torch.no_grad():
        if len({t.device for t in (*dst, *src)}) == 1:
            torch._foreach_copy_(dst, src)
        else:
            for d, s in zip(dst, src, strict=True):
                d.copy_(s)


class VariableClient:
    """Keeps ``module`` in sync with ``source``: ``update()`` fetches the parameters named
    ``name`` every ``update_period`` calls (Acme's variable client).

    Fetching is synchronous: the sources rlherd has (a learner in process, shared memory) answer
    in microseconds, and a synchronous fetch keeps a one-process run deterministic. A source with
    ``variables_version()`` is asked that first, so nothing is copied when nothing changed; and
    tensors that already are the module's own (an actor acting with its learner's network in
    one process) are never copied onto themselves.
    """

    def __init__(
        self, source: VariableSource, module: Any, name: str = "policy", update_period: int = 1
    ):
        if update_period < 1:
            raise ValueError(f"update_period must be >= 1, got {update_period}")
        self.source, self.module, self.name = source, module, name
        self.update_period = update_period
        self._calls = 0
        self._version: int | None = None
        self._loaded: int | None = None  # an asynchronous source's version last loaded
        self._version_fn = getattr(source, "variables_version", None)

    def update(self, wait: bool = False) -> None:
        """Count a call; fetch if ``update_period`` calls have passed (or now, if ``wait``)."""
        self._calls += 1
        if wait:  # now, whatever the version says (e.g. after loading a checkpoint)
            self._version = self._loaded = None
        if wait or self._calls >= self.update_period:
            self._calls = 0
            self._fetch()

    def _fetch(self) -> None:
        if self._version_fn is not None:
            version = self._version_fn()
            if version == self._version:
                return
            self._version = version
        (variables,) = self.source.get_variables([self.name])
        fetched = getattr(self.source, "fetched_version", None)
        if fetched is not None:  # an asynchronous source: maybe what was loaded last time
            self._version = fetched
            if fetched == self._loaded:
                return
            self._loaded = fetched
        own = self.module.state_dict(keep_vars=True)
        if own.keys() != variables.keys() or any(
            v.shape != own[k].shape for k, v in variables.items()
        ):
            self.module.load_state_dict(variables)  # PyTorch's error names what differs
            return
        pairs = [(own[k], v) for k, v in variables.items() if v.data_ptr() != own[k].data_ptr()]
        if pairs:
            copy_tensors([dst for dst, _ in pairs], [src for _, src in pairs])
