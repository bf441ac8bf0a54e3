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

``make_vector`` builds a batch of environments with Gymnasium's next-step autoreset (DESIGN.md):
ale-py's native ``AtariVectorEnv`` for Atari, Gymnasium's ``SyncVectorEnv`` otherwise.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import pickle
import warnings
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np

from rlherd.core import EnvSpec
from rlherd.envs import openspiel, toy
from rlherd.envs.atari import make_atari, make_atari_vector
from rlherd.run.config import ConfigError, MissingExtra

__all__ = ["EnvSpec", "family", "make", "make_vector", "save_envs", "spec_for", "spec_of"]

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


def family(env_id: str) -> str:
    """The family of an id, which picks an agent's preset: atari, minatar, control (the DeepMind
    Control Suite), openspiel, toy or classic."""
    for prefix, name in (("ALE/", "atari"), ("MinAtar/", "minatar"), ("rlherd/", "toy"),
                         ("dm_control/", "control"), ("open_spiel/", "openspiel")):  # fmt: skip
        if env_id.startswith(prefix):
            return name
    return "classic"


def is_mujoco(env_id: str) -> bool:
    """A Gymnasium MuJoCo task (``HalfCheetah-v5``, ``Hopper-v5``, ...)."""
    return env_id.split("-")[0].lower() in MUJOCO_TASKS


def known_ids() -> list[str]:
    _register_optional_families()
    return sorted([*gym.registry, *MULTI_AGENT])


def _check_id(env_id: str) -> None:
    if env_id in gym.registry:
        return
    if env_id.startswith(openspiel.PREFIX):  # any OpenSpiel game, registered on first use
        openspiel.register(env_id)
        return
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
        " dm_control/<domain>-<task>-v0, open_spiel/<game>,"
        " rlherd/Bandit-v0, rlherd/Corridor-v0, rlherd/Reach-v0, rlherd/DeepSea-v0,"
        " rlherd/MaskedCartPole-v1."
    )
    raise ConfigError(f"unknown environment id {env_id!r}.{did_you_mean}{hint}")


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
    ``length=10`` for the corridor).
    """
    if env_id in MULTI_AGENT:  # the numpy Tag games (PettingZoo ParallelEnvs)
        from rlherd.envs import reference

        return getattr(reference, MULTI_AGENT[env_id])(**kwargs)
    _check_id(env_id)
    if env_id.startswith("ALE/"):
        return make_atari(env_id, render_mode=render_mode, **kwargs)
    try:
        with _no_display_warning():
            env = gym.make(env_id, render_mode=render_mode, **kwargs)
    except (gym.error.DependencyNotInstalled, ImportError) as e:
        raise MissingExtra(f"{env_id} needs a package that is not installed ({e}); "
                           f"{_install_hint(env_id)}") from e  # fmt: skip
    except (TypeError, ValueError) as e:
        if not kwargs:
            raise  # not the user's options: a bug in the environment
        raise ConfigError(f"{env_id} does not take the options {kwargs}: {e}") from e
    if env_id.startswith("MinAtar/"):
        env = _ChannelsFirst(env)
    if env_id.startswith("dm_control/"):
        env = _FlatVector(env)
    spec_of(env, env_id)  # fail here, with the space named, rather than inside an agent
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
    return EnvSpec.from_spaces(env_id, obs_space, act_space, max_steps)


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
