"""``rlherd check-env ENV``: will rlherd train this environment, and how?

It builds the environment as a run would (:func:`rlherd.envs.make`) and reports:

- Gymnasium's own API checker (``gymnasium.utils.env_checker.check_env``) on the environment
  itself, with every warning it gives (a failure is reported; rlherd's runs do not depend on
  all it checks, e.g. NLE 1.3 fails its ``reset(options={})``, which rlherd never calls);
- the observation as rlherd carries it: each array, its shape, dtype and kind, and how an
  agent's network reads it (:mod:`rlherd.networks.encoders`), plus any leaf left out;
- the action space, and whether an action mask was found (and where);
- raw steps per second, random (legal) actions in one environment;
- how ``--resume`` goes on with it on the ``single`` runtime: mid-episode from its snapshot, or
  with new episodes, and why;
- which agents can train it (each one's networks are built for it, as a run would) and on which
  runtimes.

``rlherd check-env tag-gridworld --consistency`` runs the device environments' consistency check
against their numpy references instead (:func:`rlherd.envs.device.check_consistency`).
"""

from __future__ import annotations

import contextlib
import io
import math
import pickle
import random
import re
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np

from rlherd import envs as rl_envs
from rlherd.agents import BUILDERS
from rlherd.core import EnvSpec, Leaf
from rlherd.envs.wrappers import sample_action
from rlherd.errors import ConfigError, NeedsInput
from rlherd.runtime import RUNTIMES, runtimes_for

T = TypeVar("T")


def gymnasium_check(env: gym.Env) -> tuple[bool, list[str]]:
    """Gymnasium's checker on the environment itself (``env.unwrapped``: what its author wrote,
    under none of rlherd's wrappers nor a factory's): whether it passed, and its warnings (or
    the error that stopped it)."""
    from gymnasium.utils.env_checker import check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check_env(env.unwrapped, skip_render_check=True, skip_close_check=True)
        except Exception as e:  # the checker's verdict: reported, not raised
            return False, [*_messages(caught), f"{type(e).__name__}: {e}"]
    return True, _messages(caught)


def _messages(caught: list[warnings.WarningMessage]) -> list[str]:
    """Warnings' texts, once each, without Gymnasium's terminal colours."""
    return list(dict.fromkeys(re.sub(r"\x1b\[[0-9;]*m", "", str(w.message)).strip()
                              for w in caught))  # fmt: skip


def encoders(spec: EnvSpec) -> dict[str, str]:
    """How an agent's network reads each array of the observation (automatic choices)."""
    from rlherd.networks.encoders import auto_encoder

    if not spec.structured:
        return {"": "image torso" if spec.is_image else "MLP"}
    return {key: auto_encoder(key, leaf) for key, leaf in spec.obs.items()}


def steps_per_second(env: gym.Env | gym.vector.VectorEnv, seconds: float, seed: int) -> float:
    """Environment steps per second with uniformly random (legal) actions; a game's agents
    (one game as a vector environment, which resets itself) take one step together."""
    game = isinstance(env, gym.vector.VectorEnv)
    (env.single_action_space if game else env.action_space).seed(seed)
    obs, _ = env.reset(seed=seed)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        action = _random_actions(env, obs) if game else sample_action(env.action_space, obs)
        obs, _, terminated, truncated, _ = env.step(action)
        steps += 1
        if not game and (terminated or truncated):
            obs, _ = env.reset()
    return steps / (time.perf_counter() - start)


NOT_NATIVE = "--native-vector-env false"  # Atari as Gymnasium steps it, not ale-py's vector env


def trainers(spec: EnvSpec, envs: gym.vector.VectorEnv, env_kwargs: dict[str, Any],
             names: list[str] | None = None) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """Each agent's verdict (of ``names``, or all): the runtimes it trains the environment on,
    or why it cannot; and, by agent, the flag a runtime needs that only the user can give (a
    dataset, demonstrations). Its networks are built for the environment with its preset for
    it and it checks ``envs`` (the environment as the ``single`` runtime steps it), as a run's
    first step would; each runtime is then put to ``train``'s own checks (:func:`runtimes`)."""
    from rlherd.commands.train import resolve_config

    out: dict[str, Any] = {}
    flags: dict[str, dict[str, str]] = {}
    for name, builder_class in sorted(BUILDERS.items()):
        if names is not None and name not in names:
            continue
        try:
            config, preset = resolve_config(name, spec.env_id, None, {})
            builder = builder_class(config)
            builder.make_networks(spec)
            builder.check_environments(spec, envs)
        except (ConfigError, TypeError, ValueError) as e:
            out[name] = str(e).split("\n")[0]
            continue
        out[name], needed = runtimes(name, spec, config, preset, env_kwargs)
        if needed:
            flags[name] = needed
    return out, flags


def runtimes(agent: str, spec: EnvSpec, config: Any, preset: str,
             env_kwargs: dict[str, Any]) -> tuple[list[str] | str, dict[str, str]]:  # fmt: skip
    """The runtimes on which ``rlherd train AGENT --env ENV`` passes its checks (those it makes
    before training: :func:`~rlherd.commands.train.check_pairing` and
    :func:`~rlherd.commands.train.checked_builder`), with no flag given but the one a runtime
    asks of its user (``--dataset``, ``--demonstrations``: by runtime, the second value); or,
    where none does, why not, as the runtimes that run the agent refuse it."""
    from rlherd.commands.train import check_pairing, checked_builder, own_game

    able, needed, refusals = [], {}, {}  # refusals: the line -> the runtimes that said it
    for runtime, declared in RUNTIMES.items():
        try:
            settings = check_pairing(agent, spec.env_id, runtime, config, preset, {}, env_kwargs)
            if "gym_envs" not in declared.provides:  # the device's: a game of its own, no spec
                own_game(runtime, spec.env_id, env_kwargs)
            checked_builder(agent, config, spec if "gym_envs" in declared.provides else None,
                            runtime, settings, spec.env_id, env_kwargs)  # fmt: skip
        except NeedsInput as e:
            needed[runtime] = e.flag
        except ConfigError as e:
            if runtime in runtimes_for(BUILDERS[agent].needs):
                refusals.setdefault(str(e).splitlines()[0], []).append(runtime)
            continue
        able.append(runtime)
    if able:
        return able, needed
    said = "; ".join(f"on {', '.join(where)}: {line}" for line, where in refusals.items())
    return "no runtime both runs it and steps this environment" + (f" ({said})" if said else ""), {}


def check(env: str, env_kwargs: dict[str, Any] | None = None, seconds: float = 2.0,
          seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """The report :func:`format_report` prints (a dict, for scripts)."""
    if not 0 < seconds < math.inf:
        raise ConfigError(f"--seconds must be > 0 and finite (how long to time raw steps), got "
                          f"{seconds}")  # fmt: skip
    env_id = rl_envs.resolve(env)
    if env_id in rl_envs.MULTI_AGENT:
        raise ConfigError(
            f"{env_id} is one of the device runtime's games, stepped in batches on the device; "
            f"check it against its numpy reference with: rlherd check-env {env_id} --consistency"
        )
    probe = _probe_game if rl_envs.family(env_id) == "pettingzoo" else _probe_env
    checker, passed, notes, spec, space, sps = probe(env_id, env_kwargs or {}, seconds, seed)
    leaves = spec.obs if spec.structured else {"": spec.obs}
    return dict(
        env=env_id,
        checker=checker,
        gymnasium_check=passed,
        gymnasium_notes=notes,
        observation={k: _leaf(leaf) for k, leaf in leaves.items()},
        encoders=encoders(spec),
        dropped=list(spec.dropped),
        action=_action(spec, space),
        action_mask=spec.has_action_mask,
        steps_per_second=round(sps, 1),
        resume=resumes(env_id, env_kwargs or {}, seed),
        **_agents(spec, env_kwargs or {}),
    )


def _agents(spec: EnvSpec, env_kwargs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The report's ``agents`` (:func:`trainers`) and ``flags``: an agent that cannot train
    ale-py's vector env (MCTS's simulator copies environments) is tried again on Atari as
    Gymnasium steps it, and its runtimes then come with the flag that asks for it."""
    agents, flags = _with_single_envs(spec.env_id, env_kwargs,
                                      lambda envs: trainers(spec, envs, env_kwargs))
    if rl_envs.native_vector(spec.env_id):
        refused = [name for name, verdict in agents.items() if isinstance(verdict, str)]
        plain, plain_flags = _with_single_envs(spec.env_id, env_kwargs, lambda envs: trainers(
            spec, envs, env_kwargs, refused), native=False)  # fmt: skip
        for name, verdict in plain.items():
            if isinstance(verdict, list):
                agents[name], more = verdict, plain_flags.get(name, {})
                flags[name] = {r: f"{NOT_NATIVE}, {more[r]}" if r in more else NOT_NATIVE
                               for r in verdict}  # fmt: skip
    return dict(agents=agents, flags=flags)


def _with_single_envs(env_id: str, env_kwargs: dict[str, Any],
                      use: Callable[[gym.vector.VectorEnv], T], native: bool = True) -> T:
    """``use(envs)`` on the environment as the ``single`` runtime steps it (one of it, or the
    rows of one game), closed afterwards; ``native=False``: as with ``--native-vector-env
    false``."""
    from rlherd.envs.pettingzoo import one_game

    if rl_envs.family(env_id) == "pettingzoo":
        envs = one_game(env_id, **env_kwargs)  # what a run's rows of one game are
    else:
        envs = rl_envs.make_vector(env_id, 1, native=native, **env_kwargs)
    try:
        return use(envs)
    finally:
        envs.close()


def resumes(env_id: str, env_kwargs: dict[str, Any], seed: int, steps: int = 10) -> str:
    """How ``--resume`` goes on with the environment on the ``single`` runtime: mid-episode
    where its snapshot (:func:`rlherd.envs.pickle_envs`) restores a copy that steps as it does,
    else with new episodes, and why. Stepping the copy beside the original catches what a run
    cannot see: pickling that keeps too little of the episode (a ``__getstate__`` that drops
    it), from which a resume would go on all the same."""
    return _with_single_envs(env_id, env_kwargs, lambda envs: _resumes(envs, seed, steps))


def _resumes(envs: gym.vector.VectorEnv, seed: int, steps: int) -> str:
    envs.single_action_space.seed(seed)
    obs, _ = envs.reset(seed=seed)
    for _ in range(steps):
        obs = envs.step(_random_actions(envs, obs))[0]
    try:
        snapshot = rl_envs.pickle_envs(envs)
    except Exception as e:  # what a checkpoint's save_envs turns into new episodes
        return f"new episodes (the environment does not pickle: {type(e).__name__}: {e})"
    departs = _how_a_copy_departs(envs, obs, snapshot, steps)
    if departs:
        return f"mid-episode, but NOT exactly: a copy restored from its snapshot {departs}"
    return "mid-episode (a copy restored from its snapshot steps as it does)"


def _how_a_copy_departs(envs: gym.vector.VectorEnv, obs: Any, snapshot: bytes, steps: int) -> str:
    """How a copy unpickled from ``snapshot`` departs from ``envs`` over ``steps`` steps of the
    same random actions; "" where it does not. Each side steps from the same state of Python's
    and numpy's global random streams, as a resume restores them, so an environment that draws
    from those is not taken for one whose pickling lost its state."""
    try:
        copy = pickle.loads(snapshot)
    except Exception as e:
        return f"does not unpickle ({type(e).__name__}: {e})"
    lost = "(its pickling keeps too little of its state)"
    try:
        for _ in range(steps):
            actions = _random_actions(envs, obs)
            streams = random.getstate(), np.random.get_state()
            obs, *outcome = envs.step(actions)[:4]
            random.setstate(streams[0])
            np.random.set_state(streams[1])
            try:
                again, *outcome_again = copy.step(actions)[:4]
            except Exception as e:
                return f"raises {type(e).__name__}: {e} when stepped {lost}"
            if not (_same(obs, again) and all(map(np.array_equal, outcome, outcome_again))):
                return f"steps differently {lost}"
    finally:
        with contextlib.suppress(Exception):  # a copy that lost its state may not close either
            copy.close()
    return ""


def _random_actions(envs: gym.vector.VectorEnv, obs: Any) -> np.ndarray:
    """A uniformly random legal action for each environment of ``envs``."""
    rows = [{k: v[i] for k, v in obs.items()} if isinstance(obs, dict) else None
            for i in range(envs.num_envs)]  # fmt: skip
    return np.stack([sample_action(envs.single_action_space, row) for row in rows])


def _same(a: Any, b: Any) -> bool:
    """Two batches of observations (arrays, or dicts of them) are equal."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    return np.array_equal(a, b)


def _probe_env(env_id: str, env_kwargs: dict[str, Any], seconds: float, seed: int):
    """Gymnasium's checker on the environment, its spec, its own action space and its raw
    speed."""
    made = rl_envs.make(env_id, **env_kwargs)
    try:
        passed, notes = gymnasium_check(made)
        return ("Gymnasium's env checker", passed, notes, rl_envs.spec_of(made, env_id),
                made.action_space, steps_per_second(made, seconds, seed))  # fmt: skip
    finally:
        made.close()


def _probe_game(env_id: str, env_kwargs: dict[str, Any], seconds: float, seed: int):
    """PettingZoo's API test on a game (the parallel one, or the AEC one for a turn-based
    game), the spec one agent of it acts with, and the game's raw speed (environment steps: a
    step of all its agents; a turn-based game's, a move with the reply), with the action space
    that agent acts in."""
    from pettingzoo.test import api_test, parallel_api_test

    from rlherd.envs.pettingzoo import game_module, make_game, one_game
    from rlherd.envs.turns import make_turn_game

    turns = rl_envs.turn_based(env_id)
    if turns:
        checker, game = "PettingZoo's AEC API test", make_turn_game(game_module(env_id), env_id,
                                                                    **env_kwargs)  # fmt: skip
    else:
        checker, game = "PettingZoo's parallel API test", make_game(env_id, **env_kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # it prints its verdict
                (api_test if turns else parallel_api_test)(game, num_cycles=100)
            passed, notes = True, _messages(caught)
        except Exception as e:  # the test's verdict: reported, not raised
            passed, notes = False, [*_messages(caught), f"{type(e).__name__}: {e}"]
    game.close()
    rows = one_game(env_id, **env_kwargs)
    try:
        return (checker, passed, notes, rl_envs.spec_of(rows, env_id),
                rows.single_action_space, steps_per_second(rows, seconds, seed))  # fmt: skip
    finally:
        rows.close()


def _leaf(leaf: Leaf) -> dict[str, Any]:
    out = dict(shape=list(leaf.shape), dtype=leaf.dtype.name, kind=leaf.kind)
    if leaf.categories:
        out["categories"] = leaf.categories
    return out


def _action(spec: EnvSpec, space: gym.Space) -> str:
    """The action space as the agents read it; a MultiBinary is named as the environment
    declares it too, since the agents' refusals call its actions multidiscrete."""
    if spec.action_kind == "discrete":
        return f"Discrete({spec.num_actions})"
    if spec.action_kind == "multidiscrete":
        read = f"MultiDiscrete({list(spec.action_nvec)})"
        return f"{space}, acted in as {read}" if isinstance(space, gym.spaces.MultiBinary) else read
    return f"Box({list(spec.action_shape)})"


def format_report(report: dict[str, Any]) -> str:
    """The report as lines a person reads."""
    lines = [f"{report['env']}"]
    verdict = "passed" if report["gymnasium_check"] else (
        "FAILED (what it found below; rlherd's runs do not depend on it, --strict makes it an "
        "error)")
    lines.append(f"  {report['checker']}: {verdict}")
    lines += [f"    - {note}" for note in report["gymnasium_notes"]]
    lines.append("  observation (array: shape dtype kind -> how networks read it, unless a "
                 "preset picks a torso of its own):")
    for key, leaf in report["observation"].items():
        categories = f" ({leaf['categories']} values)" if "categories" in leaf else ""
        name = key or "(one array)"
        lines.append(f"    {name}: {tuple(leaf['shape'])} {leaf['dtype']} {leaf['kind']}"
                     f"{categories} -> {report['encoders'][key]}")  # fmt: skip
    if report["dropped"]:
        lines.append(f"    left out (not arrays): {', '.join(report['dropped'])}")
    mask = "yes, obs['action_mask']" if report["action_mask"] else "none"
    lines.append(f"  actions: {report['action']}; action mask: {mask}")
    lines.append(f"  raw speed: {report['steps_per_second']:,.0f} steps/s (random actions)")
    lines.append(f"  --resume (single runtime): {report['resume']}")
    lines.append("  agents (runtimes they train it on, or why not):")
    for name, verdict in report["agents"].items():
        text = _runtimes_text(verdict, report["flags"].get(name, {})) if isinstance(
            verdict, list) else f"no: {verdict}"  # fmt: skip
        lines.append(f"    {name}: {text}")
    if not trainable(report):
        lines.append("  no agent of rlherd trains this environment")
    return "\n".join(lines)


def _runtimes_text(runtimes: list[str], flags: dict[str, str]) -> str:
    """``single, mono (with --x)``; one flag every runtime needs is said once, at the end."""
    if len(runtimes) > 1 and len(set(flags.values())) == 1 and set(flags) == set(runtimes):
        return f"{', '.join(runtimes)} (with {flags[runtimes[0]]})"
    return ", ".join(f"{r} (with {flags[r]})" if r in flags else r for r in runtimes)


def trainable(report: dict[str, Any]) -> bool:
    """Some agent trains the environment on some runtime."""
    return any(isinstance(verdict, list) for verdict in report["agents"].values())
