"""Atari through ALE with the DeepMind preprocessing used by IMPALA / TorchBeast.

Defaults: up to 30 no-op starts, frame skip 4 with max-pooling over the last two frames, 84x84
grayscale, a stack of 4 frames (observations ``[4, 84, 84]`` uint8), full episodes (set
``episodic_life=True`` for end-of-life episodes), sticky actions as in ``-v5`` ids (0.25), and raw
rewards (agents clip rewards in the learner, so episode returns stay game scores).

``make_atari`` builds one Gymnasium environment; ``make_atari_vector`` builds ale-py's native
``AtariVectorEnv`` (C++ threads, next-step autoreset) with the same preprocessing.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlherd.errors import MissingExtra, UnsupportedEnv, not_a_count

DEFAULTS: dict[str, Any] = dict(
    noop_max=30,
    frame_skip=4,
    screen_size=84,
    stack=4,
    episodic_life=False,
    repeat_action_probability=0.25,
    max_num_frames_per_episode=108_000,
)


def _import_ale():
    try:
        import ale_py
    except ImportError as e:  # pragma: no cover - depends on the install
        raise MissingExtra(
            "Atari environments need the 'atari' extra: pip install 'rlherd[atari]'"
        ) from e
    gym.register_envs(ale_py)
    return ale_py


def game_name(env_id: str) -> str:
    """``"ALE/Pong-v5"`` -> ``"pong"``; ``"ALE/SpaceInvaders-v5"`` -> ``"space_invaders"``."""
    name = env_id.split("/", 1)[-1].rsplit("-v", 1)[0]
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))


LEAST = dict(noop_max=0, frame_skip=1, screen_size=1, stack=1, max_num_frames_per_episode=0)


def _options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The options with the defaults, each checked here: Gymnasium's wrappers assert theirs
    deep inside, and ale-py takes a sticky-action probability above 1."""
    unknown = set(kwargs) - set(DEFAULTS)
    if unknown:
        raise UnsupportedEnv(
            f"unknown Atari options {sorted(unknown)}; known options: {sorted(DEFAULTS)}"
        )
    options = {**DEFAULTS, **kwargs}
    for name, least in LEAST.items():
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise UnsupportedEnv(f"Atari option {not_a_count(name, least, value)}")
    sticky = options["repeat_action_probability"]
    if isinstance(sticky, bool) or not isinstance(sticky, int | float) or not 0 <= sticky <= 1:
        raise UnsupportedEnv(f"Atari option repeat_action_probability must be in [0, 1], got "
                             f"{sticky!r}")  # fmt: skip
    if not isinstance(options["episodic_life"], bool):
        raise UnsupportedEnv(f"Atari option episodic_life must be true or false, got "
                             f"{options['episodic_life']!r}")  # fmt: skip
    return options


def make_atari(env_id: str, render_mode: str | None = None, **kwargs: Any) -> gym.Env:
    _import_ale()
    o = _options(kwargs)
    try:
        env = gym.make(
            env_id,
            frameskip=1,  # AtariPreprocessing does the skipping (with max-pooling)
            repeat_action_probability=o["repeat_action_probability"],
            max_num_frames_per_episode=o["max_num_frames_per_episode"],
            render_mode=render_mode,
        )
    except gym.error.Error as e:  # ale-py's refusal of an option's value (a render mode)
        raise UnsupportedEnv(f"{env_id}: {e}") from None
    env = gym.wrappers.AtariPreprocessing(
        env,
        noop_max=o["noop_max"],
        frame_skip=o["frame_skip"],
        screen_size=o["screen_size"],
        terminal_on_life_loss=o["episodic_life"],
        grayscale_obs=True,
    )
    return gym.wrappers.FrameStackObservation(env, o["stack"])


def make_atari_vector(env_id: str, num_envs: int, **kwargs: Any) -> gym.vector.VectorEnv:
    ale_py = _import_ale()
    o = _options(kwargs)
    return ale_py.vector_env.AtariVectorEnv(
        game_name(env_id),
        num_envs,
        num_threads=min(num_envs, 2),
        repeat_action_probability=o["repeat_action_probability"],
        max_num_frames_per_episode=o["max_num_frames_per_episode"],
        img_height=o["screen_size"],
        img_width=o["screen_size"],
        stack_num=o["stack"],
        frameskip=o["frame_skip"],
        noop_max=o["noop_max"],
        episodic_life=o["episodic_life"],
        reward_clipping=False,
        use_fire_reset=False,
        autoreset_mode="NextStep",
    )
