"""Environments: one ``make(env_id)`` for every supported family.

Families, by id:

- Gymnasium ids (``CartPole-v1``, ``HalfCheetah-v5``, ...), built with ``gymnasium.make``;
- Atari, ``ALE/<Game>-v5``, with DeepMind preprocessing (see :mod:`rlherd.envs.atari`);
- MinAtar, ``MinAtar/<Game>-v1``, observations as ``[C, 10, 10]`` uint8;
- the Behaviour Suite, ``bsuite/<experiment>/<n>`` (``bsuite/deep_sea/0``), each one of bsuite's
  sweep settings, logging bsuite's CSV where asked (see :mod:`rlherd.envs.bsuite`);
- the DeepMind Control Suite, ``dm_control/<domain>-<task>-v0`` (Shimmy's Gymnasium bindings),
  observations flattened into one float32 vector, with an ``action_repeat`` option
  (``--env-kwargs '{"action_repeat": 2}'``: each action held for 2 of the suite's steps);
- OpenSpiel's two-player board games, ``open_spiel/<game>`` (``tic_tac_toe``, ``connect_four``,
  ...), both players in one environment for self-play (see :mod:`rlherd.envs.openspiel`);
- rlherd's tiny test environments, ``rlherd/Bandit-v0``, ``rlherd/Corridor-v0``,
  ``rlherd/Reach-v0`` (continuous actions), ``rlherd/DeepSea-v0`` (bsuite's exploration test)
  and ``rlherd/MaskedCartPole-v1`` (CartPole without its velocities: a memory test);
- any other environment Gymnasium can make: ``module:Env-v0`` imports ``module`` (which
  registers the id) first, in every process that makes it; bare ids of the packages in
  :data:`PACKAGES` (``MiniGrid-*``, ``NetHack*``) import theirs; and ``module:function`` names an
  environment factory, a function returning a ``gymnasium.Env`` (:func:`resolve` turns a Python
  callable into that path, which is what a run records and every process imports).

Every environment is then given rlherd's one view of observations (:mod:`rlherd.envs.wrappers`):
an array, or one level of named arrays, with any action mask at ``obs["action_mask"]``.

``make_vector`` builds a batch of environments with Gymnasium's next-step autoreset (DESIGN.md):
ale-py's native ``AtariVectorEnv`` for Atari, Gymnasium's ``SyncVectorEnv`` otherwise.
"""

from __future__ import annotations

import copyreg
import dataclasses
import functools
import inspect
import io
import os
import pickle
import zlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils.ezpickle import EzPickle

from rlherd.core import EnvSpec
from rlherd.envs import toy
from rlherd.envs.atari import make_atari, make_atari_vector
from rlherd.envs.bsuite import make_bsuite
from rlherd.envs.ids import (
    MULTI_AGENT,
    check_id,
    check_recorded,
    env_factory,
    family,
    is_mujoco,
    no_display_warning,
    resolve,
    split_id,
    target,
)
from rlherd.envs.wrappers import (
    ActionMaskObservation,
    ActionRepeat,
    ApiCheck,
    NamedArrays,
    StepCheck,
    mask_source,
)
from rlherd.errors import ConfigError, MissingExtra, not_a_count
from rlherd.types import ACTION_MASK

__all__ = ["EnvSpec", "MULTI_AGENT", "check_recorded", "env_factory", "family", "is_mujoco",
           "make", "make_one", "make_vector", "pickle_envs", "resolve", "save_envs", "spec_for",
           "spec_of"]  # fmt: skip

toy.register()

# NetHack's observation keys unless --env-kwargs names others: the glyphs and bottom-line stats
# the NLE paper's TorchBeast baseline reads (Kuettler et al. 2020). NLE's full set adds, among
# others, an 80-character description of each of the 1,659 screen cells to every step.
NETHACK_KEYS = ("glyphs", "blstats")




class _ChannelsFirst(gym.ObservationWrapper):
    """MinAtar's ``[10, 10, C]`` bool grids as ``[C, 10, 10]`` uint8, like Atari frames."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        h, w, c = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 1, shape=(c, h, w), dtype=np.uint8)

    def observation(self, observation):
        return np.ascontiguousarray(np.transpose(observation, (2, 0, 1)), dtype=np.uint8)


class _FlatVector(gym.ObservationWrapper):
    """The Control Suite's dict of float64 arrays as one float32 vector, in the dict's order."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        size = gym.spaces.flatdim(env.observation_space)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(size,), dtype=np.float32)

    def observation(self, observation):
        return gym.spaces.flatten(self.env.observation_space, observation).astype(np.float32)


def make(env_id: str, /, *, render_mode: str | None = None, **kwargs: Any) -> gym.Env:
    """Build one environment of any supported family, with the family's standard preprocessing.

    Extra keyword arguments go to the family's builder (e.g. ``episodic_life=True`` for Atari,
    ``length=10`` for the corridor) or to the factory.
    """
    if not isinstance(env_id, str):
        raise ConfigError(f"make takes an environment id such as 'CartPole-v1', got {env_id!r}")
    if family(env_id) == "pettingzoo":
        from rlherd.envs.pettingzoo import game_module

        game_module(env_id)  # a game there is, or the module missing named
        raise ConfigError(
            f"{env_id} is a multi-agent game, and this takes one single-agent environment: "
            "train it with rlherd train and play it with rlherd eval, which step its agents "
            "together"
        )
    if env_id in MULTI_AGENT:  # the numpy Tag games (PettingZoo ParallelEnvs)
        from rlherd.envs import reference

        return getattr(reference, MULTI_AGENT[env_id])(**kwargs)
    if render_mode is not None and not isinstance(render_mode, str):
        raise ConfigError(f"{env_id}: render_mode must be a name such as 'rgb_array', got "
                          f"{render_mode!r}")  # fmt: skip
    kind, named = target(env_id) if ":" in env_id else ("id", env_id)
    if kind == "factory":
        env = _call_factory(named, env_id, render_mode, kwargs)
    elif family(named) == "bsuite":
        env = make_bsuite(named, **kwargs)
    else:
        check_id(named)
        if named.startswith("ALE/"):
            return make_atari(named, render_mode=render_mode, **kwargs)
        if family(named) == "nethack":
            kwargs.setdefault("observation_keys", NETHACK_KEYS)
        control = named.startswith("dm_control/")
        repeat = kwargs.pop("action_repeat", 1) if control else 1
        repeat = _at_least_one(env_id, "action_repeat", repeat)
        env = _gym_make(named, render_mode, kwargs)
        if named.startswith("MinAtar/"):
            env = _ChannelsFirst(env)
        if control:
            env = _FlatVector(env if repeat == 1 else ActionRepeat(env, repeat))
    _check_render_mode(env, env_id, render_mode)
    env = _standard_observations(env, env_id, f"{env_id} {sorted(kwargs.items())}")
    spec_of(env, env_id)  # fail here, with the space named, rather than inside an agent
    return env


def _check_render_mode(env: gym.Env, env_id: str, render_mode: str | None) -> None:
    """A render mode the environment does not name among its own: Gymnasium only logs it, and
    every frame would then be None (a video of nothing)."""
    modes = env.metadata.get("render_modes")
    if render_mode is not None and modes and render_mode not in modes:
        env.close()
        frames = "; it draws no frames to record: drop --video" * (render_mode == "rgb_array")
        raise ConfigError(f"{env_id} renders as {', '.join(map(str, modes))}; render_mode "
                          f"{render_mode!r} is not one of them{frames}")  # fmt: skip


def _at_least_one(env_id: str, name: str, steps: Any) -> int:
    """A count of steps given as an option (a Control Suite task's ``action_repeat``, Gymnasium's
    ``max_episode_steps``): a whole number, 1 or more."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"{env_id}: {not_a_count(name, 1, steps)}")
    return steps


def _gym_make(env_id: str, render_mode: str | None, kwargs: dict[str, Any]) -> gym.Env:
    if kwargs.get("max_episode_steps") is not None:  # Gymnasium asserts it, deep in gym.make
        _at_least_one(env_id, "max_episode_steps", kwargs["max_episode_steps"])
    # render_mode only where one is asked: gym.make hands it on, and an environment of one's
    # own need not take it.
    options = dict(kwargs, render_mode=render_mode) if render_mode else kwargs
    try:
        with no_display_warning():
            return gym.make(env_id, **options)
    except (gym.error.DependencyNotInstalled, ImportError) as e:
        raise MissingExtra(f"{env_id} needs a package that is not installed ({e}); "
                           f"{_install_hint(env_id)}") from e  # fmt: skip
    except (TypeError, ValueError) as e:
        if not options:
            raise  # not the user's options: a bug in the environment
        raise _options_refused(env_id, options, e) from e


def _options_refused(env_id: str, options: dict[str, Any], error: Exception) -> ConfigError:
    """The line for options an environment does not take; a render mode among them is most
    often asked by a video (``rlherd eval --video``), not given with the environment's options."""
    drawn = ("; --video makes it with render_mode='rgb_array': take render_mode in its "
             "constructor, or drop --video") if options.get("render_mode") == "rgb_array" else ""
    return ConfigError(f"{env_id} does not take the options {options}: {error}{drawn}")


def _call_factory(
    factory: Callable[..., Any], env_id: str, render_mode: str | None, kwargs: dict[str, Any]
) -> gym.Env:
    """The environment ``factory`` returns (``render_mode`` passed only where one is asked).
    Options the factory's signature cannot take are one line; a ``TypeError`` from inside the
    call is the factory's own bug and keeps its traceback, unless the factory passes options on
    unseen (``**kwargs``, or no signature to read), where it may be theirs."""
    options = dict(kwargs, render_mode=render_mode) if render_mode else kwargs
    try:
        signature = inspect.signature(factory)
    except ValueError:  # a callable without a signature to read
        signature = None
    if signature is not None:
        try:
            signature.bind(**options)
        except TypeError as e:  # the call itself cannot be made
            if options:
                raise _options_refused(env_id, options, e) from None
            raise ConfigError(f"{env_id} cannot be called without arguments ({e}); an "
                              "environment factory takes the environment's options "
                              "(--env-kwargs) as keywords") from None
    passes_on = signature is None or any(
        p.kind is p.VAR_KEYWORD for p in signature.parameters.values())  # fmt: skip
    try:
        env = factory(**options)
    except TypeError as e:
        if options and passes_on:
            raise _options_refused(env_id, options, e) from e
        raise
    if not isinstance(env, gym.Env):
        raise ConfigError(
            f"{env_id} returned {type(env).__name__}, not a gymnasium.Env; an environment "
            "factory returns one environment (wrap other APIs, e.g. with Shimmy)"
        )
    return env


# Where each id's action mask comes from, with its options (None: no mask outside its
# observation), found once per process: finding an "info" mask takes one reset.
_MASKS: dict[str, str | None] = {}
# Gymnasium's own families, MinAtar's and rlherd's have no masks in info and keep to their
# spaces: their environments are never reset to look (their first numbers stay as they were),
# nor checked at every step (StepCheck).
_KNOWN_MODULES = ("gymnasium.envs.classic_control", "gymnasium.envs.box2d",
                  "gymnasium.envs.mujoco", "minatar", "rlherd.envs.")  # fmt: skip


def _standard_observations(env: gym.Env, env_id: str, key: str) -> gym.Env:
    """``env`` with rlherd's one view of observations (:mod:`rlherd.envs.wrappers`), checked at
    every step unless it is of a family rlherd knows keeps to its spaces; ``key`` names its id
    and options."""
    own = not type(env.unwrapped).__module__.startswith(_KNOWN_MODULES)  # one's own, say
    if own:
        env = _innermost(env, lambda inner: ApiCheck(inner, env_id))
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or space.shape == ():
        env = NamedArrays(env, env_id)
    looks = own and isinstance(env.action_space, gym.spaces.Discrete)
    blind = looks and env.render_mode == "human"  # a reset to look would open a window
    source = _MASKS.get(key) if key in _MASKS else mask_source(
        env, env_id, env.reset()[1] if looks and not blind else None)  # fmt: skip
    if not blind:  # what was not looked for is not remembered for the id's later makes
        _MASKS[key] = source
    if source is not None:
        env = ActionMaskObservation(env, source, env_id)
    space = env.observation_space
    masked = looks and isinstance(space, gym.spaces.Dict) and ACTION_MASK in space.spaces
    return StepCheck(env, env_id, masked, late_masks=not blind) if own else env


def _innermost(env: gym.Env, wrap: Callable[[gym.Env], gym.Wrapper]) -> gym.Env:
    """``env`` with ``wrap`` put around the environment itself, inside the wrappers ``gym.make``
    added (TimeLimit, OrderEnforcing, PassiveEnvChecker unpack what it returns)."""
    if not isinstance(env, gym.Wrapper):
        return wrap(env)
    outer = env
    while isinstance(outer.env, gym.Wrapper):
        outer = outer.env
    outer.env = wrap(outer.env)
    return env


def _install_hint(env_id: str) -> str:
    """How to install what a Gymnasium id needs: rlherd's extra where it has one."""
    entry = str(gym.spec(env_id).entry_point)
    for family_name, extra in (("mujoco", "pip install 'rlherd[mujoco]'"),
                               ("box2d", "pip install 'gymnasium[box2d]'")):  # fmt: skip
        if f".{family_name}" in entry:
            return f"install it with: {extra}"
    return "install the package it names"


def make_vector(
    env_id: str,
    num_envs: int,
    /,
    *,
    native: bool = True,
    workers: int = 0,
    selfplay: dict[str, Any] | None = None,
    agent_index: bool = False,
    **kwargs: Any,
) -> gym.vector.VectorEnv:
    """``num_envs`` environments stepped together, with next-step autoreset.

    ``native=True`` uses ale-py's C++ vector environment for Atari. Otherwise the environments
    are built with :func:`make` and stepped in ``workers`` processes by a
    :class:`~rlherd.envs.vector.BatchEnv`, or in this process (Gymnasium's ``SyncVectorEnv``)
    when ``workers=0``. Seed with ``reset(seed=s)``: environment ``i`` gets seed ``s + i``. A
    turn-based PettingZoo game plays against the learner's past selves as ``selfplay`` says,
    and a parallel game's agents observe their index too if ``agent_index``
    (:func:`rlherd.envs.pettingzoo.game_rows`).
    """
    if num_envs < 1:
        raise ConfigError(f"num_envs must be >= 1, got {num_envs}")
    if family(env_id) == "pettingzoo":
        if workers > 0:
            raise ConfigError(
                f"{env_id}'s games are stepped in the actor's own process: drop --env-workers "
                "(mono and distributed step games in parallel)"
            )
        from rlherd.envs.pettingzoo import game_rows

        return game_rows(env_id, num_envs, selfplay, agent_index, **kwargs)
    name = split_id(env_id)[1]
    if ":" not in env_id:
        check_id(env_id)
    if native and native_vector(env_id):
        return make_atari_vector(name, num_envs, **kwargs)
    if workers > 0:
        from rlherd.envs.vector import BatchEnv

        fns = [functools.partial(make, env_id, **kwargs)] * num_envs
        return BatchEnv(fns, num_workers=min(workers, num_envs))
    return gym.vector.SyncVectorEnv(
        [functools.partial(make, env_id, **kwargs)] * num_envs,
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )


def native_vector(env_id: str) -> bool:
    """Whether :func:`make_vector` steps ``env_id`` in ale-py's C++ vector environment unless
    told ``native=False`` (Atari)."""
    return split_id(env_id)[1].startswith("ALE/")


def make_one(
    env_id: str, agent_index: bool = False, **kwargs: Any
) -> gym.Env | gym.vector.VectorEnv:
    """One environment to play whole episodes in (an evaluation, ``rlherd eval``): :func:`make`'s,
    or for a multi-agent game, one game with its agents as rows (each observing its index too
    if ``agent_index``)."""
    if family(env_id) == "pettingzoo":
        from rlherd.envs.pettingzoo import one_game

        return one_game(env_id, agent_index, **kwargs)
    return make(env_id, **kwargs)


def spec_of(env: gym.Env | gym.vector.VectorEnv, env_id: str | None = None) -> EnvSpec:
    """The :class:`EnvSpec` of a single or vector environment."""
    if isinstance(env, gym.vector.VectorEnv):
        obs_space, act_space = env.single_observation_space, env.single_action_space
    else:
        obs_space, act_space = env.observation_space, env.action_space
    spec = getattr(env, "spec", None)
    env_id = env_id or (spec.id if spec is not None else type(env).__name__)
    max_steps = spec.max_episode_steps if spec is not None else None
    out = EnvSpec.from_spaces(env_id, obs_space, act_space, max_steps)
    # Leaves NamedArrays (or a game's AgentRows) left out, and a game's agents a step.
    try:
        dropped = tuple(env.get_wrapper_attr("dropped"))
    except AttributeError:  # a vector env: only AgentRows says
        dropped = tuple(getattr(env, "dropped", ()))
    agents = getattr(env, "agents_per_game", 1)
    return dataclasses.replace(out, dropped=dropped, agents=agents)


def turn_based(env_id: str) -> bool:
    """Whether ``env_id`` is a turn-based PettingZoo game, played by self-play
    (:mod:`rlherd.envs.turns`)."""
    if family(env_id) != "pettingzoo":
        return False
    from rlherd.envs.pettingzoo import turn_based as is_turn_based

    return is_turn_based(env_id)


def with_policies(spec: EnvSpec, setting: str, agent_index: bool = False,
                  **kwargs: Any) -> EnvSpec:  # fmt: skip
    """``spec`` with the run's mapping of a multi-agent game's agents to policies (``setting``:
    :func:`rlherd.envs.pettingzoo.assign_policies`), and with each agent's index among its
    inputs if ``agent_index``; an environment of one agent has neither."""
    if spec.agents > 1:
        from rlherd.envs.pettingzoo import one_game, policies_of

        if agent_index:
            rows = one_game(spec.env_id, agent_index=True, **kwargs)
            rows.close()
            spec = dataclasses.replace(spec_of(rows, spec.env_id), agent_index=True)
        return dataclasses.replace(spec, policies=policies_of(spec.env_id, setting, **kwargs))
    if setting or agent_index:
        what = f"policies={setting!r}" if setting else "agent_index"
        raise ConfigError(f"{what} is for the agents of a multi-agent game, and {spec.env_id} "
                          "has one agent")  # fmt: skip
    return spec


def dropped_notice(spec: EnvSpec) -> str | None:
    """One line on the observation's leaves that were left out (not arrays), and how to keep
    one, or None."""
    if not spec.dropped:
        return None
    return (
        f"{spec.env_id}: left out of the observation: {', '.join(spec.dropped)} (not an array, "
        "so no network can read it). To use it, turn it into an array in a wrapper (e.g. text "
        "as token ids in a Box) and pass an environment factory that applies it."
    )


def spec_for(env_id: str, /, **kwargs: Any) -> EnvSpec:
    """The :class:`EnvSpec` of ``env_id``, from a probe environment built and closed here
    (which also fails fast, with a clear message, on a bad id or space); a PettingZoo game's
    is one agent's, which a shared policy acts with."""
    if family(env_id) == "pettingzoo":
        from rlherd.envs.pettingzoo import one_game

        rows = one_game(env_id, **kwargs)
        rows.close()
        return spec_of(rows, env_id)
    if env_id in MULTI_AGENT:
        raise ConfigError(
            f"{env_id} is a multi-agent game: single-agent runtimes cannot step it; train it on "
            "the device runtime (--runtime device)"
        )
    probe = make(env_id, **kwargs)
    try:
        return spec_of(probe, env_id)
    finally:
        probe.close()


def env_progress(envs: gym.vector.VectorEnv) -> list[Any] | None:
    """What each environment can hand back as plain data to go on from where its pickled
    snapshot cannot be loaded (its ``plain_progress()``: a bsuite id's counts and CSV rows);
    None where none can."""
    states = [_progress_of(env) for env in getattr(envs, "envs", [])]
    return states if any(state is not None for state in states) else None


def _progress_of(env: gym.Env) -> Any:
    progress = getattr(getattr(env, "unwrapped", env), "plain_progress", None)
    return progress() if callable(progress) else None


def continue_envs(envs: gym.vector.VectorEnv, states: list[Any]) -> None:
    """Give fresh environments the :func:`env_progress` of those they replace (their
    ``continue_from_progress``)."""
    for env, state in zip(envs.envs, states, strict=True):
        if state is not None:
            env.unwrapped.continue_from_progress(state)


def save_envs(envs: gym.vector.VectorEnv) -> bytes | None:
    """A vector env's full state as bytes for a checkpoint, or None where it cannot be pickled
    (ale-py's vector env, a BatchEnv's processes, Shimmy's Control Suite environments, whose
    registration is a local function): a resumed run restarts its episodes."""
    try:
        return pickle_envs(envs)
    except Exception:  # pickling what an environment holds can raise anything (ctypes: ValueError)
        return None


def pickle_envs(envs: gym.vector.VectorEnv) -> bytes:
    """:func:`save_envs`' bytes, raising what pickling raises where it cannot (``rlherd check-env``
    names it)."""
    buffer = io.BytesIO()
    _StatePickler(buffer, pickle.HIGHEST_PROTOCOL).dump(envs)
    return buffer.getvalue()


class _StatePickler(pickle.Pickler):
    """Pickles Gymnasium's ``EzPickle`` objects as they are, every attribute, where their own
    pickling keeps only their constructor's arguments and unpickles a new object. MuJoCo's
    environments and PettingZoo's games are ``EzPickle``: a snapshot of theirs would resume a
    new simulator or an empty board under an episode that goes on. A class that pickles its own
    way (its own ``__getstate__`` or ``__setstate__``, slots, a ``copyreg`` entry) keeps its way
    (``typing.Generic``'s empty ``__slots__``, in every Gymnasium environment's classes, is none).
    Pygame's surfaces and fonts, which do not pickle, go as plain data (:func:`_pygame_reduction`).
    """

    def reducer_override(self, obj: Any) -> Any:
        cls = type(obj)
        if cls.__module__ == "pygame" or cls.__module__.startswith("pygame."):
            return _pygame_reduction(obj)
        if (isinstance(obj, EzPickle) and cls.__getstate__ is EzPickle.__getstate__
                and cls.__setstate__ is EzPickle.__setstate__ and cls not in copyreg.dispatch_table
                and not any(vars(base).get("__slots__") for base in cls.__mro__)):  # fmt: skip
            return copyreg.__newobj__, (cls,), obj.__dict__, None, None, _set_attributes
        return NotImplemented


def _pygame_reduction(obj: Any) -> Any:
    """Pygame's surfaces and fonts, which do not pickle, rebuilt from plain data: a surface from
    its pixels (some games draw their observations on one and keep drawing on it), compressed,
    since a rendering canvas is mostly background; a font by opening its file again. Other
    pygame objects (a window's display surface among them) do not pickle, as before."""
    import pygame
    import pygame.freetype

    if isinstance(obj, pygame.Surface) and obj is not pygame.display.get_surface():
        mode = "RGBA" if obj.get_flags() & pygame.SRCALPHA else "RGB"
        pixels = zlib.compress(pygame.image.tobytes(obj, mode), 1)
        return _surface, (obj.get_size(), obj.get_flags(), obj.get_bitsize(), mode, pixels,
                          obj.get_colorkey(), obj.get_alpha())  # fmt: skip
    if isinstance(obj, pygame.freetype.Font) and os.path.isfile(obj.path):
        return _font, (obj.path, obj.size, obj.style)
    return NotImplemented


def _surface(size: tuple[int, int], flags: int, bitsize: int, mode: str, pixels: bytes,
             colorkey: Any, alpha: Any) -> Any:  # fmt: skip
    """Unpickling's half of :func:`_pygame_reduction` for a surface (snapshots name it)."""
    import pygame

    surface = pygame.Surface(size, flags, bitsize)
    surface.blit(pygame.image.frombytes(zlib.decompress(pixels), size, mode), (0, 0))
    if colorkey is not None:
        surface.set_colorkey(colorkey)
    if alpha is not None and not flags & pygame.SRCALPHA:
        surface.set_alpha(alpha)
    return surface


def _font(path: str, size: Any, style: int) -> Any:
    """Unpickling's half of :func:`_pygame_reduction` for a font (snapshots name it): FreeType
    must be started in a process that has not drawn text yet."""
    import pygame.freetype

    pygame.freetype.init()
    font = pygame.freetype.Font(path, size)
    font.style = style
    return font


def _set_attributes(obj: Any, attributes: dict[str, Any]) -> None:
    """Unpickling's half of :class:`_StatePickler`: the attributes back, with no ``__setstate__``
    (``EzPickle``'s would build the object anew). Snapshots name this function: renaming or
    moving it makes those already written unloadable."""
    obj.__dict__.update(attributes)
