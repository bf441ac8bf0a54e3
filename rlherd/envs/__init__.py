"""Environments: one ``make(env_id)`` for every supported family.

Families, by id:

- Gymnasium ids (``CartPole-v1``, ``HalfCheetah-v5``, ...), built with ``gymnasium.make``;
- Atari, ``ALE/<Game>-v5``, with DeepMind preprocessing (see :mod:`rlherd.envs.atari`);
- MinAtar, ``MinAtar/<Game>-v1``, observations as ``[C, 10, 10]`` uint8;
- the DeepMind Control Suite, ``dm_control/<domain>-<task>-v0`` (Shimmy's Gymnasium bindings),
  observations flattened into one float32 vector;
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

import contextlib
import dataclasses
import difflib
import functools
import importlib
import importlib.util
import pickle
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlherd.core import EnvSpec
from rlherd.envs import openspiel, toy
from rlherd.envs.atari import make_atari, make_atari_vector
from rlherd.envs.wrappers import (
    ActionMaskObservation,
    FlatObservation,
    mask_source,
    needs_flattening,
)
from rlherd.run.config import ConfigError, MissingExtra

__all__ = ["EnvSpec", "family", "make", "make_vector", "resolve", "save_envs", "spec_for",
           "spec_of"]  # fmt: skip

toy.register()


def _register_optional_families() -> None:
    """Make the ids of installed optional families known to Gymnasium's registry."""
    try:
        import ale_py

        gym.register_envs(ale_py)
    except ImportError:
        pass
    if not any(k.startswith("MinAtar/") for k in gym.registry):
        try:
            from minatar.gym import register_envs

            register_envs()
        except ImportError:
            pass
    if not any(k.startswith("dm_control/") for k in gym.registry):
        try:
            with _no_display_warning():
                import shimmy

                gym.register_envs(shimmy)
        except ImportError:
            pass


@contextlib.contextmanager
def _no_display_warning() -> Iterator[None]:
    """dm_control imports glfw, which warns on a machine with no display (rendering still works
    with ``MUJOCO_GL=egl`` or ``osmesa``)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*DISPLAY environment variable")
        yield


# Multi-agent games, built as their numpy references (their device versions: rlherd.envs.device).
MULTI_AGENT = {"tag-gridworld": "TagGridWorldReference", "tag-continuous": "TagContinuousReference"}


# Gymnasium's MuJoCo tasks, by the name before the version (continuous-control presets).
MUJOCO_TASKS = (
    "halfcheetah", "hopper", "ant", "walker2d", "humanoid", "humanoidstandup", "swimmer",
    "reacher", "pusher", "invertedpendulum", "inverteddoublependulum",
)  # fmt: skip


# Packages whose environments register themselves when imported (Gymnasium 1.x no longer
# imports installed packages by itself): a bare id of theirs imports the package first, and a
# run records it as ``module:id`` so that every process imports it too.
PACKAGES: tuple[tuple[str, str, str], ...] = (
    # (id prefix, module that registers the ids, how to install it)
    ("MiniGrid-", "minigrid", "pip install 'rlherd[minigrid]'"),
    ("BabyAI-", "minigrid", "pip install 'rlherd[minigrid]'"),
    ("NetHack", "nle", "pip install 'rlherd[nethack]'"),
)

# NetHack's observation keys unless --env-kwargs names others: the glyphs and bottom-line stats
# the NLE paper's TorchBeast baseline reads (Kuettler et al. 2020). NLE's full set adds, among
# others, an 80-character description of each of the 1,659 screen cells to every step.
NETHACK_KEYS = ("glyphs", "blstats")


def _split_id(env_id: str) -> tuple[str, str]:
    """``("module", "name")`` of ``module:name``; ``("", env_id)`` of a plain id."""
    module, sep, name = env_id.partition(":")
    return (module, name) if sep else ("", env_id)


def family(env_id: str) -> str:
    """The family of an id, which picks an agent's preset: atari, minatar, control (the DeepMind
    Control Suite), openspiel, toy, minigrid, nethack, toytext (Gymnasium's toy text) or
    classic (anything else)."""
    module, name = _split_id(env_id)
    for prefix, kind in (("ALE/", "atari"), ("MinAtar/", "minatar"), ("rlherd/", "toy"),
                         ("dm_control/", "control"), ("open_spiel/", "openspiel")):  # fmt: skip
        if name.startswith(prefix):
            return kind
    if module == "minigrid" or name.startswith(("MiniGrid-", "BabyAI-")):
        return "minigrid"
    if module == "nle" or name.startswith("NetHack"):
        return "nethack"
    if name in gym.registry and "toy_text" in str(gym.spec(name).entry_point):
        return "toytext"
    return "classic"


def is_mujoco(env_id: str) -> bool:
    """A Gymnasium MuJoCo task (``HalfCheetah-v5``, ``Hopper-v5``, ...)."""
    return env_id.split("-")[0].lower() in MUJOCO_TASKS


def known_ids() -> list[str]:
    _register_optional_families()
    return sorted([*gym.registry, *MULTI_AGENT])


def _package(env_id: str) -> tuple[str, str] | None:
    """``(module, install hint)`` of a bare id of one of :data:`PACKAGES`."""
    for prefix, module, install in PACKAGES:
        if env_id.startswith(prefix):
            return module, install
    return None


def _import(module: str, env_id: str, install: str | None = None) -> Any:
    """Import the module an id names; one that is not installed is a :class:`MissingExtra`."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        how = install or f"install the package that provides {module!r}"
        raise MissingExtra(f"{env_id} needs the module {module!r}, which is not installed: {how}")
    with _no_display_warning():
        return importlib.import_module(module)


def _check_id(env_id: str) -> None:
    if env_id in gym.registry:
        return
    if env_id.startswith(openspiel.PREFIX):  # any OpenSpiel game, registered on first use
        openspiel.register(env_id)
        return
    package = _package(env_id)
    if package is not None:
        _import(*package[:1], env_id, package[1])
    else:
        _register_optional_families()
    if env_id in gym.registry:
        return
    ids = known_ids()
    hint = ""
    for prefix, extra in (("ALE/", "atari"), ("MinAtar/", "minatar"), ("dm_control/", "control")):
        if env_id.startswith(prefix) and not any(i.startswith(prefix) for i in ids):
            hint = f" {prefix[:-1]} ids need the '{extra}' extra: pip install 'rlherd[{extra}]'."
    close = difflib.get_close_matches(env_id, ids, n=5, cutoff=0.6)
    if not close:  # match on the name alone, e.g. "Cartpole" -> "CartPole-v1"
        lower = {i.lower(): i for i in ids}
        close = [lower[c] for c in difflib.get_close_matches(env_id.lower(), list(lower), n=5)]
    did_you_mean = (
        f" Did you mean: {', '.join(close)}?"
        if close
        else " Known families: Gymnasium ids (CartPole-v1), ALE/<Game>-v5, MinAtar/<Game>-v1,"
        " dm_control/<domain>-<task>-v0, open_spiel/<game>, MiniGrid-*, NetHack*,"
        " rlherd/Bandit-v0, rlherd/Corridor-v0, rlherd/Reach-v0, rlherd/DeepSea-v0,"
        " rlherd/MaskedCartPole-v1; any other package's ids as module:Env-v0."
    )
    raise ConfigError(f"unknown environment id {env_id!r}.{did_you_mean}{hint}")


def _target(env_id: str) -> tuple[str, Any]:
    """What ``module:name`` names once ``module`` is imported: ``("id", name)`` for an id it
    registered, ``("factory", function)`` for a function of the module."""
    module_name, name = _split_id(env_id)
    if not module_name or not name:
        raise ConfigError(f"{env_id!r}: write module:Env-v0 or package.module:function")
    module = _import(module_name, env_id)
    if name in gym.registry:
        return "id", name
    factory = getattr(module, name, None)
    if callable(factory):
        return "factory", factory
    close = difflib.get_close_matches(name, list(gym.registry), n=5, cutoff=0.6)
    did_you_mean = f" Did you mean: {', '.join(close)}?" if close else ""
    raise ConfigError(
        f"{env_id!r}: importing {module_name} registered no environment {name!r}, and "
        f"{module_name} has no function of that name.{did_you_mean}"
    )


def resolve(env: str | Callable[..., gym.Env]) -> str:
    """The id a run records for ``env``, which every process (actor processes, environment
    servers, Ray nodes, ``rlherd eval``, ``--resume``) can make: a registered id as it is, a
    bare id of one of :data:`PACKAGES` as ``module:id``, and an environment factory (a function
    returning a ``gymnasium.Env``) as its import path ``package.module:function``.

    A factory must be a module-level function of an importable module: other processes import
    it by that path, so a lambda, a nested function or one defined in ``__main__`` is refused.

    >>> resolve("CartPole-v1")
    'CartPole-v1'
    """
    if callable(env):
        module, name = getattr(env, "__module__", None), getattr(env, "__qualname__", "")
        if module in (None, "__main__") or not name.isidentifier():
            raise ConfigError(
                f"environment factory {env!r} cannot be imported by other processes: define it "
                "at the top level of a module (my_envs.py: def make_env(): ...) and pass that "
                "function, or its path 'my_envs:make_env'"
            )
        env = f"{module}:{name}"
    if not isinstance(env, str) or not env:
        raise ConfigError(f"env must be an id or an environment factory, not {env!r}")
    if env in MULTI_AGENT or env.startswith(openspiel.PREFIX):
        return env
    if ":" in env:
        _target(env)
        return env
    package = _package(env)
    if package is not None:
        _check_id(env)
        return f"{package[0]}:{env}"
    _check_id(env)
    return env


def check_recorded(env_id: str, run_dir: str | Path) -> None:
    """Refuse a run's recorded environment whose module is not installed, or would be imported
    from inside the run directory itself: importing a module runs its code, and a run directory
    (shared, downloaded) must never run code of its own. (``python -m`` puts the working
    directory first on the import path, so a run's own ``evil.py`` would be found first.)"""
    module, _ = _split_id(env_id)
    if not module:
        return
    found = importlib.util.find_spec(module.split(".")[0])
    if found is None:
        raise MissingExtra(
            f"this run's environment {env_id!r} needs the module {module!r}, which is not "
            "installed here; install the package that provides it"
        )
    places = [found.origin, *(found.submodule_search_locations or [])]
    inside = Path(run_dir).resolve()
    if any(p and Path(p).resolve().is_relative_to(inside) for p in places):
        raise ConfigError(
            f"this run's environment {env_id!r} would import {module!r} from inside the run "
            f"directory ({found.origin}); rlherd imports only installed modules for a run. "
            "Run from another directory, or install the package"
        )


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


def make(env_id: str, *, render_mode: str | None = None, **kwargs: Any) -> gym.Env:
    """Build one environment of any supported family, with the family's standard preprocessing.

    Extra keyword arguments go to the family's builder (e.g. ``episodic_life=True`` for Atari,
    ``length=10`` for the corridor) or to the factory.
    """
    if env_id in MULTI_AGENT:  # the numpy Tag games (PettingZoo ParallelEnvs)
        from rlherd.envs import reference

        return getattr(reference, MULTI_AGENT[env_id])(**kwargs)
    kind, target = _target(env_id) if ":" in env_id else ("id", env_id)
    if kind == "factory":
        env = _call_factory(target, env_id, render_mode, kwargs)
    else:
        _check_id(target)
        if target.startswith("ALE/"):
            return make_atari(target, render_mode=render_mode, **kwargs)
        if family(target) == "nethack":
            kwargs.setdefault("observation_keys", NETHACK_KEYS)
        env = _gym_make(target, render_mode, kwargs)
    if kind == "id" and target.startswith("MinAtar/"):
        env = _ChannelsFirst(env)
    if kind == "id" and target.startswith("dm_control/"):
        env = _FlatVector(env)
    env = _standard_observations(env, f"{env_id} {sorted(kwargs.items())}")
    spec_of(env, env_id)  # fail here, with the space named, rather than inside an agent
    return env


def _gym_make(env_id: str, render_mode: str | None, kwargs: dict[str, Any]) -> gym.Env:
    try:
        with _no_display_warning():
            return gym.make(env_id, render_mode=render_mode, **kwargs)
    except (gym.error.DependencyNotInstalled, ImportError) as e:
        raise MissingExtra(f"{env_id} needs a package that is not installed ({e}); "
                           f"{_install_hint(env_id)}") from e  # fmt: skip
    except (TypeError, ValueError) as e:
        if not kwargs:
            raise  # not the user's options: a bug in the environment
        raise ConfigError(f"{env_id} does not take the options {kwargs}: {e}") from e


def _call_factory(
    factory: Callable[..., Any], env_id: str, render_mode: str | None, kwargs: dict[str, Any]
) -> gym.Env:
    """The environment ``factory`` returns (``render_mode`` passed only where one is asked)."""
    options = dict(kwargs, render_mode=render_mode) if render_mode else kwargs
    try:
        env = factory(**options)
    except TypeError as e:
        if options:
            raise ConfigError(f"{env_id} does not take the options {options}: {e}") from e
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
# Gymnasium's own families, MinAtar's and rlherd's have no masks: their environments are never
# reset to look (their first numbers stay as they were).
_NO_MASK_MODULES = ("gymnasium.envs.classic_control", "gymnasium.envs.box2d",
                    "gymnasium.envs.mujoco", "minatar", "rlherd.envs.toy")  # fmt: skip


def _standard_observations(env: gym.Env, key: str) -> gym.Env:
    """``env`` with rlherd's one view of observations (:mod:`rlherd.envs.wrappers`); ``key``
    names its id and options."""
    if needs_flattening(env.observation_space):
        env = FlatObservation(env)
    if key not in _MASKS:
        info = None
        entry = str(getattr(env.spec, "entry_point", "") or type(env.unwrapped).__module__)
        if isinstance(env.action_space, gym.spaces.Discrete) and not entry.startswith(
            _NO_MASK_MODULES
        ):
            info = env.reset()[1]
        _MASKS[key] = mask_source(env, info)
    if _MASKS[key] is not None:
        env = ActionMaskObservation(env, _MASKS[key])
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
    env_id: str, num_envs: int, *, native: bool = True, workers: int = 0, **kwargs: Any
) -> gym.vector.VectorEnv:
    """``num_envs`` environments stepped together, with next-step autoreset.

    ``native=True`` uses ale-py's C++ vector environment for Atari. Otherwise the environments
    are built with :func:`make` and stepped in ``workers`` processes by a
    :class:`~rlherd.envs.vector.BatchEnv`, or in this process (Gymnasium's ``SyncVectorEnv``)
    when ``workers=0``. Seed with ``reset(seed=s)``: environment ``i`` gets seed ``s + i``.
    """
    if num_envs < 1:
        raise ConfigError(f"num_envs must be >= 1, got {num_envs}")
    if ":" not in env_id:
        _check_id(env_id)
    if native and env_id.startswith("ALE/"):
        return make_atari_vector(env_id, num_envs, **kwargs)
    if workers > 0:
        from rlherd.envs.vector import BatchEnv

        fns = [functools.partial(make, env_id, **kwargs)] * num_envs
        return BatchEnv(fns, num_workers=min(workers, num_envs))
    return gym.vector.SyncVectorEnv(
        [functools.partial(make, env_id, **kwargs)] * num_envs,
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )


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
    try:  # leaves FlatObservation left out (a vector env's are its environments')
        dropped = tuple(env.get_wrapper_attr("dropped"))
    except AttributeError:
        return out
    return dataclasses.replace(out, dropped=dropped) if dropped else out


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


def spec_for(env_id: str, **kwargs: Any) -> EnvSpec:
    """The :class:`EnvSpec` of ``env_id``, from a probe environment built and closed here
    (which also fails fast, with a clear message, on a bad id or space)."""
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


def save_envs(envs: gym.vector.VectorEnv) -> bytes | None:
    """A vector env's full state as bytes for a checkpoint, or None where it cannot be pickled
    (ale-py's native vector env, a BatchEnv's processes): a resumed run restarts its episodes."""
    try:
        return pickle.dumps(envs)
    except (TypeError, AttributeError, pickle.PicklingError):
        return None
