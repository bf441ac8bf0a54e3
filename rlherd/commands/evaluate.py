"""``rlherd eval``: run a trained policy for a number of episodes, optionally recording a video."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlherd import envs as rl_envs
from rlherd.agents import BUILDERS
from rlherd.agents.groups import for_policies
from rlherd.config import apply_overrides
from rlherd.core import policy_state
from rlherd.errors import ConfigError
from rlherd.run.evaluation import episode_policies, episode_stats, eval_actor, run_episodes
from rlherd.run.rundir import RunDir, RunRecord
from rlherd.run.video import check_writable, write_video
from rlherd.runtime import RUNTIMES
from rlherd.types import batch_of_one


def load_run(run_dir: str | Path) -> tuple[RunRecord, Any, dict[str, Any]]:
    """A finished or running run: its record, its agent's builder and its latest checkpoint,
    each checked (with summary.json) before anything runs."""
    rundir = RunDir(run_dir)
    record = rundir.read_config()
    rundir.read_summary()
    return record, builder_of(record, rundir.path), rundir.load_checkpoint()


def builder_of(record: RunRecord, path: Path):
    """The builder of the run at ``path`` (its ``record``), with its recorded config; one line
    if it names an agent or config fields this rlherd lacks (another version's run)."""
    where = path / "config.json"
    if record.agent not in BUILDERS:
        raise ConfigError(f"{where} names agent {record.agent!r}, which this rlherd does not "
                          f"have (it has {', '.join(sorted(BUILDERS))})")  # fmt: skip
    builder_class = BUILDERS[record.agent]
    try:
        return builder_class(apply_overrides(builder_class.config_class(), record.config))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e} (a run of another rlherd version?)") from None


def play_against(env, actor, opponent, games: int) -> dict[str, float]:
    """``games`` games of a two-player OpenSpiel ``env`` between ``actor`` and ``opponent``
    (:mod:`rlherd.envs.openspiel`), the actor moving first in every other game: its win, draw
    and loss rates, overall and as the first and second player."""
    game_env = env.unwrapped
    actor.bind_environments([env])
    outcomes: dict[int, list[float]] = {0: [], 1: []}
    for g in range(games):
        me = g % 2
        obs, _ = env.reset(seed=g)
        actor.observe_first(batch_of_one(obs), np.ones(1, dtype=bool))
        terminated = False
        while not terminated:
            if game_env.current_player == me:
                action = actor.select_action(batch_of_one(obs))[0]
            else:
                action = opponent(game_env)
            obs, _, terminated, _, _ = env.step(action)
        outcomes[me].append(float(game_env.state.returns()[me]))
    result: dict[str, float] = {}
    for name, scores in (("", outcomes[0] + outcomes[1]), ("first_", outcomes[0]),
                         ("second_", outcomes[1])):  # fmt: skip
        scores_ = np.asarray(scores)
        for outcome, value in (("win", 1.0), ("draw", 0.0), ("loss", -1.0)):
            result[f"{name}{outcome}_rate"] = float(np.mean(scores_ == value))
    return result


def evaluate(
    run_dir: str | Path,
    episodes: int = 10,
    video: str | Path | None = None,
    greedy: bool = True,
    seed: int = 1_000_000,
    opponent: str | None = None,
) -> dict[str, Any]:
    """Mean return of the run's latest policy over ``episodes`` episodes; the first episode is
    recorded to ``video`` (.gif or .mp4) if given. The result is added to summary.json as
    ``eval_return_mean``. In a two-player game, ``opponent`` (``random``, ``mcts:N`` or
    ``perfect``) plays the other side of ``episodes`` games, and the result holds the win, draw
    and loss rates (:func:`play_against`)."""
    if episodes < 1:
        raise ConfigError(f"episodes must be >= 1, got {episodes}")
    if video:  # before the episodes are played, not after
        check_writable(Path(video))
    record, builder, checkpoint = load_run(run_dir)
    if (opponent is not None) != (rl_envs.family(record.env) == "openspiel"):
        raise ConfigError(
            f"--opponent plays the other side of a two-player game; {record.env} "
            + ("is not one" if opponent is not None else "is one: name an opponent, e.g. "
               "--opponent random, mcts:200 or perfect")  # fmt: skip
        )
    runtime = RUNTIMES.get(record.runtime)
    if runtime is not None and "gym_envs" not in runtime.provides:
        # A runtime with environments of its own (device) evaluates its runs; the others'
        # runs play here, without importing their runtime (a Ray run evaluates without Ray).
        own = runtime.hook("evaluate")
        if own is None:
            raise ConfigError(f"the {record.runtime} runtime cannot evaluate its runs (its "
                              f"module {runtime.module} has no evaluate())")  # fmt: skip
        result = own(record, builder, checkpoint, episodes, video, greedy, seed)
        _add_to_summary(run_dir, result)
        return result
    spec = rl_envs.with_policies(rl_envs.spec_for(record.env, **record.env_kwargs),
                         record.settings.get("policies", ""), **record.env_kwargs)  # fmt: skip
    builder = for_policies(builder, spec, record.settings.get("policy_overrides", {}))
    net = builder.make_networks(spec, device="cpu")
    net.load_state_dict(policy_state(checkpoint["learner"]))
    net.eval()
    if video and rl_envs.family(record.env) == "pettingzoo":
        raise ConfigError(f"--video records one agent's episode; {record.env} is a multi-agent "
                          "game, which rlherd does not record yet: drop --video")  # fmt: skip
    render = dict(render_mode="rgb_array") if video else {}
    env = rl_envs.make_one(record.env, **render, **record.env_kwargs)
    actor = eval_actor(builder, spec, net, greedy, seed)
    if opponent is not None:
        from rlherd.envs.openspiel import make_opponent

        rival = make_opponent(opponent, env.unwrapped.game, seed)
        rates = play_against(env, actor, rival, episodes)
        result = dict(opponent=opponent, games=episodes, **rates)
        env.close()
        _add_to_summary(run_dir, {f"vs_{opponent}": result})
        return result
    returns, lengths, frames = run_episodes(env, actor, episodes, seed, record=bool(video))
    env.close()
    if video:
        write_video(Path(video), frames)
    policies = episode_policies(env, actor, episodes)
    result = dict(**episode_stats(returns, lengths, policies), eval_episodes=episodes,
                  eval_greedy=greedy)  # fmt: skip
    _add_to_summary(run_dir, result)
    return result


def _add_to_summary(run_dir: str | Path, result: dict[str, Any]) -> None:
    rundir = RunDir(run_dir)
    rundir.write_summary({**rundir.read_summary(), **result})
