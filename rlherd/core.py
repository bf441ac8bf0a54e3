"""The seams every agent and runtime share (Acme's, in PyTorch): the environment spec, the
``Actor`` / ``Learner`` / ``VariableSource`` / ``Adder`` / ``Worker`` / ``Builder`` protocols,
TensorFlow Agents' ``BatchedAlgorithm`` and the ``VariableClient``.

An agent is written once against these; runtimes (single, mono, ...) decide where the pieces run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np

from rlherd.errors import UnsupportedEnv
from rlherd.types import ACTION_MASK

if TYPE_CHECKING:  # environment workers import this module without torch
    import torch


@dataclass(frozen=True)
class Leaf:
    """One array of an observation, and what its values are, which decides how a network reads
    it (:mod:`rlherd.networks.encoders`).

    ``kind`` is ``"box"`` (numbers), ``"discrete"`` (integers ``0 .. categories - 1`` in every
    entry: a ``Discrete`` or ``MultiDiscrete`` space) or ``"binary"`` (0 or 1: ``MultiBinary``).
    An integer box whose bounds lie in ``[0, n)`` has ``categories = n`` too (NetHack's glyphs:
    5,977), so a grid of codes can be embedded; other boxes have 0.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    kind: str = "box"
    categories: int = 0

    @classmethod
    def of(cls, space: gym.Space) -> Leaf:
        if isinstance(space, gym.spaces.Discrete):
            return cls((), np.dtype(np.int64), "discrete", int(space.n))
        if isinstance(space, gym.spaces.MultiDiscrete):
            return cls(tuple(space.shape), np.dtype(np.int64), "discrete", int(space.nvec.max()))
        if isinstance(space, gym.spaces.MultiBinary):
            return cls(tuple(space.shape), np.dtype(space.dtype), "binary", 2)
        if isinstance(space, gym.spaces.Box):
            dtype, categories = np.dtype(space.dtype), 0
            if dtype.kind in "iu" and space.low.min() >= 0:
                high = int(space.high.max())
                categories = high + 1 if high < 2**31 - 1 else 0
            return cls(tuple(space.shape), dtype, "box", categories)
        raise TypeError(f"{space!r} is not an array space")


ARRAY_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete,
                gym.spaces.MultiBinary)  # fmt: skip
CONTAINERS = (gym.spaces.Dict, gym.spaces.Tuple)
# The key of an observation's own array where it must join a dict: codes alone (below), or an
# array beside the action mask that rlherd.envs moves into the observation. PettingZoo's name.
OBS_KEY = "observation"


def _leaves(space: gym.Space, value: Any = None, path: str = "") -> Iterator[tuple]:
    """``(path, space, value)`` of every leaf of a (nested) space and of a value of it; a
    leaf that is not an array has the space ``None``."""
    if isinstance(space, CONTAINERS):
        items = space.spaces.items() if isinstance(space, gym.spaces.Dict) else enumerate(space)
        for key, sub in items:
            yield from _leaves(sub, None if value is None else value[key],
                               f"{path}.{key}" if path else str(key))  # fmt: skip
    else:
        yield path, space if isinstance(space, ARRAY_SPACES) else None, value


def _codes_from_zero(space: gym.Space, value: Any = None) -> tuple[gym.Space, Any]:
    """A ``Discrete`` or ``MultiDiscrete`` space counted from 0 in int64 (what every agent's
    one-hots and embeddings index), and a value of it shifted the same way; other spaces and
    their values as they are."""
    if isinstance(space, gym.spaces.Discrete):
        shifted = None if value is None else np.asarray(value, np.int64) - int(space.start)
        return gym.spaces.Discrete(space.n), shifted
    if isinstance(space, gym.spaces.MultiDiscrete):
        shifted = None if value is None else np.asarray(value, np.int64) - space.start
        return gym.spaces.MultiDiscrete(space.nvec, dtype=np.int64), shifted
    return space, value


def _carried(space: gym.Space, value: Any = None) -> tuple[gym.Space, Any]:
    """A leaf as rlherd carries it, and a value of it (one, or a batch): codes counted from 0
    (:func:`_codes_from_zero`), and a scalar ``Box`` as a vector of one, since every network
    reads a leaf's last dimension as its features."""
    space, value = _codes_from_zero(space, value)
    if isinstance(space, gym.spaces.Box) and space.shape == ():
        vector = gym.spaces.Box(space.low.reshape(1), space.high.reshape(1), dtype=space.dtype)
        return vector, None if value is None else np.expand_dims(np.asarray(value), -1)
    return space, value


def flatten_space(space: gym.Space, whose: str = "the") -> tuple[gym.Space, list[str]]:
    """A Gymnasium observation space as rlherd carries it, and the keys it leaves out.

    A ``Box`` stays as it is: the one array an agent reads (and ``EnvSpec.obs`` a single
    :class:`Leaf`). A ``Discrete``, ``MultiDiscrete`` or ``MultiBinary`` alone becomes a ``Dict``
    of that one array under :data:`OBS_KEY`, so that networks read its codes by their kind
    (one-hot, embedding) as they read them in any dict. ``Dict`` and ``Tuple`` spaces, nested or
    not, become one ``Dict`` of their array leaves, keyed by their paths joined with ``"."`` (a
    ``Tuple``'s entries by position: ``"0"``, ``"1"``); leaves that are not arrays (MiniGrid's
    ``mission`` text, a ``Graph``) are left out and their keys returned, so the caller can say
    so once. Codes count from 0, in int64, and a scalar ``Box`` is a vector of one. ``whose``
    names the observation's environment (``"MyEnv-v0's"``) in the line that refuses a space.
    """
    if isinstance(space, gym.spaces.Box):
        return _carried(space)[0], []
    if not isinstance(space, ARRAY_SPACES + CONTAINERS):
        return space, []
    # "is not None": a space's truth is its len(), which a 2-D MultiDiscrete warns about
    arrays = [(path or OBS_KEY, s) for path, s, _ in _leaves(space) if s is not None]
    leaves = {path: _carried(s)[0] for path, s in arrays}
    if len(leaves) < len(arrays):  # one would overwrite the other in every observation
        twice = next(path for path in leaves if [p for p, _ in arrays].count(path) > 1)
        raise UnsupportedEnv(f"two arrays of {whose} observation are both named {twice!r} once "
                             "its nested keys are joined with '.' (a key holding '.' beside a "
                             "nested one): rename one")  # fmt: skip
    dropped = [path for path, s, _ in _leaves(space) if s is None]
    return gym.spaces.Dict(leaves), dropped


def flatten_value(space: gym.Space, value: Any) -> Any:
    """``value``, an observation of ``space``, laid out as :func:`flatten_space` lays out the
    space. Works on a batch of observations too (a recorded episode's), whose leaves have a
    leading dimension."""
    if isinstance(space, gym.spaces.Box):
        return _carried(space, value)[1]
    return {path or OBS_KEY: _carried(s, v)[1]
            for path, s, v in _leaves(space, value) if s is not None}


# A batch of observations: an array, or a dict of named arrays (see flatten_space), each with the
# environments along its first dimension.
Observation = np.ndarray | dict[str, np.ndarray]


def stack_obs(observations: list[Any]) -> Any:
    """Observations of one environment (each an array or a dict of arrays) as rows of one."""
    if isinstance(observations[0], dict):
        return {key: np.stack([o[key] for o in observations]) for key in observations[0]}
    return np.stack(observations)


@dataclass(frozen=True)
class EnvSpec:
    """What an agent needs to know about an environment, derived from its Gymnasium spaces.

    ``obs`` is the observation: one :class:`Leaf`, or a dict of them by key (see
    :func:`flatten_space`; an action mask is the key ``"action_mask"``). ``dropped`` names the
    leaves left out (not arrays).

    ``action_kind`` is ``"discrete"`` (``num_actions`` choices), ``"multidiscrete"`` (one
    choice per entry of ``action_nvec``) or ``"continuous"`` (a box of ``action_shape`` between
    ``action_low`` and ``action_high``).

    ``agents`` is how many rows one step of the environment has: 1, or a multi-agent game's
    agents (:mod:`rlherd.envs.pettingzoo`), whose runs count environment steps while learners
    count the rows they learn from. ``policies`` names the policy of each of a game's agents,
    in order (the run's mapping, :func:`rlherd.envs.pettingzoo.assign_policies`); empty for one
    agent. ``agent_index``: each agent observes its index too (the run's ``agent_index``).
    """

    env_id: str
    obs: Leaf | dict[str, Leaf]
    action_kind: str
    num_actions: int = 0
    action_shape: tuple[int, ...] = ()
    action_low: np.ndarray | None = None
    action_high: np.ndarray | None = None
    max_episode_steps: int | None = None
    action_nvec: tuple[int, ...] = ()
    dropped: tuple[str, ...] = ()
    agents: int = 1
    policies: tuple[str, ...] = ()
    agent_index: bool = False

    @property
    def structured(self) -> bool:
        """The observation is a dict of arrays."""
        return isinstance(self.obs, dict)

    @property
    def has_action_mask(self) -> bool:
        """Discrete actions whose legal ones the observation's ``action_mask`` says."""
        return self.structured and ACTION_MASK in self.obs and self.action_kind == "discrete"

    @property
    def obs_shape(self) -> tuple[int, ...]:
        """The shape of an observation that is one array."""
        return self._single().shape

    @property
    def obs_dtype(self) -> np.dtype:
        return self._single().dtype

    def _single(self) -> Leaf:
        if isinstance(self.obs, dict):
            raise UnsupportedEnv(
                f"{self.env_id} observes a dict of arrays ({', '.join(self.obs)}), and this part "
                "of rlherd reads one array; flatten it with gymnasium.wrappers.FlattenObservation"
            )
        return self.obs

    @property
    def is_image(self) -> bool:
        """One array of three sides, usually uint8: ``[C, H, W]``, or channels-last
        ``[H, W, C]`` where the last side is the shortest
        (:func:`rlherd.networks.channels_last`)."""
        return not self.structured and len(self.obs.shape) == 3

    @classmethod
    def from_spaces(
        cls,
        env_id: str,
        observation_space: gym.Space,
        action_space: gym.Space,
        max_episode_steps: int | None = None,
    ) -> EnvSpec:
        flat, dropped = flatten_space(observation_space)
        if isinstance(flat, gym.spaces.Dict):
            obs: Leaf | dict[str, Leaf] = {k: Leaf.of(s) for k, s in flat.spaces.items()}
            if not obs:
                raise UnsupportedEnv(
                    f"{env_id}: observation space {observation_space!r} holds no arrays for an "
                    "agent to read"
                )
        elif isinstance(flat, ARRAY_SPACES):
            obs = Leaf.of(flat)
        else:
            raise UnsupportedEnv(
                f"{env_id}: observation space {observation_space!r} is not supported; rlherd "
                "agents read Box, Discrete, MultiDiscrete and MultiBinary arrays, and Dict or "
                "Tuple spaces of them"
            )
        common = dict(env_id=env_id, obs=obs, max_episode_steps=max_episode_steps,
                      dropped=tuple(dropped))  # fmt: skip
        if isinstance(obs, dict) and ACTION_MASK in obs:
            unmasked(env_id, "its observation's action_mask", action_space)
        if isinstance(action_space, gym.spaces.Discrete):
            if int(action_space.start) != 0:
                raise UnsupportedEnv(
                    f"{env_id}: action space {action_space!r} starts at {action_space.start}; "
                    "rlherd expects Discrete(n) actions numbered from 0 (shift them in an "
                    "ActionWrapper)"
                )
            mask = obs.get(ACTION_MASK) if isinstance(obs, dict) else None
            if mask is not None and mask.shape != (int(action_space.n),):
                raise UnsupportedEnv(
                    f"{env_id}: its action mask has shape {mask.shape}, but it has "
                    f"{action_space.n} actions; a mask has one entry per action (true: legal)"
                )
            return cls(action_kind="discrete", num_actions=int(action_space.n), **common)
        if isinstance(action_space, gym.spaces.MultiDiscrete) and action_space.nvec.ndim == 1:
            if np.any(action_space.start != 0):  # the agents' actions would be off by start
                raise UnsupportedEnv(
                    f"{env_id}: action space {action_space!r} starts at "
                    f"{action_space.start.tolist()}; rlherd expects MultiDiscrete actions "
                    "numbered from 0 (shift them in an ActionWrapper)"
                )
            nvec = tuple(int(n) for n in action_space.nvec)
            return cls(action_kind="multidiscrete", action_nvec=nvec, action_shape=(len(nvec),),
                       **common)  # fmt: skip
        if isinstance(action_space, gym.spaces.MultiBinary) and len(action_space.shape) == 1:
            n = int(action_space.shape[0])  # n choices of two: MultiDiscrete([2] * n)'s actions
            return cls(action_kind="multidiscrete", action_nvec=(2,) * n, action_shape=(n,),
                       **common)  # fmt: skip
        if isinstance(action_space, gym.spaces.Box):
            if len(action_space.shape) != 1:
                raise UnsupportedEnv(
                    f"{env_id}: action space {action_space!r} has shape {action_space.shape}; "
                    "rlherd's continuous agents act in a vector, a Box of shape (n,) (reshape "
                    "it in an ActionWrapper)"
                )
            if np.dtype(action_space.dtype).kind in "biu":  # choices, not amounts
                raise UnsupportedEnv(
                    f"{env_id}: action space {action_space!r} holds integers, and rlherd's "
                    "continuous agents act in real numbers (it would be given floats): declare "
                    "its choices as MultiDiscrete(high - low + 1), numbered from 0 (an "
                    "ActionWrapper adds low)"
                )
            return cls(
                action_kind="continuous",
                action_shape=tuple(action_space.shape),
                action_low=np.asarray(action_space.low),
                action_high=np.asarray(action_space.high),
                **common,
            )
        raise UnsupportedEnv(
            f"{env_id}: action space {action_space!r} is not supported; rlherd agents act in "
            "Discrete, MultiDiscrete, MultiBinary (of one dimension) or Box action spaces."
        )


def unmasked(env_id: str, mask: str, action_space: gym.Space) -> None:
    """Refuse an action mask (``mask`` says where it is) of actions other than ``Discrete``:
    no agent reads one, so their illegal actions would be played in silence."""
    if not isinstance(action_space, gym.spaces.Discrete):
        raise UnsupportedEnv(
            f"{env_id}: {mask} would be ignored, as rlherd honours action masks of Discrete "
            f"actions only, and its actions are {action_space!r}: make them one Discrete (a "
            "gymnasium.ActionWrapper), or leave the mask out"
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


POLICY_KEY = "net"
"""Where a learner's checkpointed state (:meth:`Learner.state_dict`) holds its policy: the state
dict of the networks its builder made (:meth:`Builder.make_networks`)."""


def policy_state(learner_state: dict[str, Any]) -> dict[str, Any]:
    """The policy within a learner's checkpointed state: a state dict that loads into a fresh
    ``builder.make_networks(spec)``.

    Why a function: evaluation, dataset collection and the device runtime act with a finished
    run's policy without making its learner (optimisers, targets, replay tables), so they read it
    out of the checkpoint; this is the one place that says where it is."""
    return learner_state[POLICY_KEY]


@runtime_checkable
class Learner(VariableSource, Protocol):
    """Consumes exactly one batch from its dataset per ``step()``; checkpointable. Runtimes drive
    learners only through ``step()``.

    ``state_dict()`` holds ``policy_state()`` under :data:`POLICY_KEY`, so that
    :func:`policy_state` finds the policy in a checkpoint without a learner."""

    def step(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def policy_state(self) -> dict[str, Any]:
        """The state dict of the networks this learner trains (those its builder made), which
        actors and evaluators act with."""
        ...


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
        obs: torch.Tensor | dict[str, torch.Tensor],
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

    def select_action(self, obs: Observation) -> np.ndarray: ...

    def observe_first(self, obs: Observation, envs: np.ndarray) -> None: ...

    def observe(
        self,
        action: np.ndarray,
        reward: np.ndarray,
        next_obs: Observation,
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

    def perform(self, obs: Observation) -> np.ndarray: ...

    def experience(self, obs, action, reward, next_obs, terminated, truncated, skip) -> None: ...

    def end_episodes(self, indices: np.ndarray) -> None: ...


@runtime_checkable
class Adder(Protocol):
    """Turns one environment's steps into replay items (see :mod:`rlherd.replay.adders`)."""

    def add_first(self, obs: Observation) -> None: ...

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
