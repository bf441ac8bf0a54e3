"""``rlherd eval``: run a trained policy for a number of episodes, optionally recording a video."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlherd import envs as rl_envs
from rlherd.config import apply_overrides
from rlherd.core import VariableClient
from rlherd.errors import ConfigError
from rlherd.run.rundir import RunDir, atomic_write_json, read_json
from rlherd.run.video import check_writable, write_video
from rlherd.types import batch_of_one


def load_run(run_dir: str | Path):
    """A finished or running run: its metadata, its agent's builder and its latest checkpoint,
    each checked (with summary.json) before anything runs."""
    rundir = RunDir(run_dir)
    meta = rundir.read_config()
    rundir.read_summary()
    return meta, builder_of(meta, rundir.path), rundir.load_checkpoint()


def builder_of(meta: dict[str, Any], path: Path):
    """The builder of the run at ``path`` (its ``meta``, config.json), with its recorded config;
    one line if it names an agent or config fields this rlherd lacks (another version's run)."""
    from rlherd.agents import BUILDERS  # here: the evaluator's module is a runtime's, too

    where = path / "config.json"
    if meta["agent"] not in BUILDERS:
        raise ConfigError(f"{where} names agent {meta['agent']!r}, which this rlherd does not "
                          f"have (it has {', '.join(sorted(BUILDERS))})")  # fmt: skip
    builder_class = BUILDERS[meta["agent"]]
    try:
        return builder_class(apply_overrides(builder_class.config_class(), meta["config"]))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e} (a run of another rlherd version?)") from None


# Steps after which an evaluation episode is cut: Atari's 30 minutes of play at 60 frames per
# second (Machado et al. 2018). Environments without a limit of their own (MinAtar's) can go on
# forever under a good greedy policy, and an evaluation must end.
MAX_EPISODE_STEPS = 108_000


def run_episodes(env, actor, episodes: int, seed: int, record: bool = False):
    """Returns and lengths of ``episodes`` episodes of ``actor`` (an :class:`~rlherd.core.Actor`
    acting in a batch of one) in ``env``, each cut after ``MAX_EPISODE_STEPS``; the frames of
    the first one if ``record``."""
    returns, lengths, frames = [], [], []
    if hasattr(actor, "bind_environments"):  # a search's simulator copies the environment
        actor.bind_environments([env])
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        actor.observe_first(batch_of_one(obs), np.ones(1, dtype=bool))
        done, ret, length = False, 0.0, 0
        while not done and length < MAX_EPISODE_STEPS:
            if record and episode == 0:
                frames.append(_render(env))
            action = actor.select_action(batch_of_one(obs))[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
            ret, length = ret + float(reward), length + 1
        returns.append(ret)
        lengths.append(length)
    return returns, lengths, frames


def _render(env) -> np.ndarray:
    """A frame of ``env``, without Gymnasium's checker warning (on the first frame) that it is not
    uint8 or that the environment declares no frame rate (MinAtar's frames are both): a video
    takes frames of any dtype (:func:`~rlherd.run.video.as_video`) and has its own rate."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(No render fps|RGB-array rendering should)")
        return env.render()


def episode_stats(returns: list[float], lengths: list[int]) -> dict[str, float]:
    """What an evaluation reports of its episodes, with how many were cut at the step limit."""
    return dict(
        eval_return_mean=float(np.mean(returns)),
        eval_return_std=float(np.std(returns)),
        eval_episode_length_mean=float(np.mean(lengths)),
        eval_episodes_cut=int(np.sum(np.asarray(lengths) >= MAX_EPISODE_STEPS)),
    )


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


def eval_actor(builder, spec, net, greedy: bool, seed: int):
    """An actor with no adder: it never writes to replay; its parameters are ``net``'s."""
    return builder.make_actor(seed, builder.make_policy(net, evaluation=greedy), spec, None, None)


class EvalEpisodes:
    """The greedy policy's episodes on its own environment and its own copy of the network: what
    an evaluator plays, in the learner's process or on a node of its own (``distributed``)."""

    def __init__(self, builder, spec, env_id, env_kwargs, episodes, seed):
        self.builder, self.spec, self.episodes, self.seed = builder, spec, episodes, seed
        with torch.random.fork_rng():  # building a network must not shift training's RNG
            self.net = builder.make_networks(spec, device="cpu")
        self.net.eval()
        self.env = rl_envs.make(env_id, **env_kwargs)

    def __call__(self, source) -> dict[str, float]:
        """Play with the parameters of ``source`` (a VariableSource); the evaluator.csv columns."""
        VariableClient(source, self.net).update(wait=True)
        actor = eval_actor(self.builder, self.spec, self.net, True, self.seed)
        returns, lengths, _ = run_episodes(self.env, actor, self.episodes, self.seed)
        return episode_stats(returns, lengths)

    def close(self) -> None:
        self.env.close()


class Evaluator:
    """Runs the evaluation policy (greedy) for ``episodes`` episodes every ``every_steps`` steps
    of what the run counts (actor steps; learner steps offline; :class:`EvalEpisodes`), and logs
    ``metrics/evaluator.csv`` and ``eval_return_mean``.
    It has no adder: it never writes to replay, and it never changes the training actors' RNG
    streams."""

    def __init__(self, builder, spec, env_id, env_kwargs, recorder, every_steps, episodes, seed):
        self.recorder, self.every_steps = recorder, every_steps
        self.play = EvalEpisodes(builder, spec, env_id, env_kwargs, episodes, seed + 10_000_000)
        steps = int(recorder.counters[recorder.counts])
        self.next_at = (steps // every_steps + 1) * every_steps

    def due(self) -> int | None:
        """The steps now, if an evaluation is due (the next is then scheduled)."""
        steps = int(self.recorder.counters[self.recorder.counts])
        if steps < self.next_at:
            return None
        self.next_at = (steps // self.every_steps + 1) * self.every_steps
        return steps

    def log(self, steps: int, row: dict[str, float]) -> None:
        self.recorder.rundir.log("evaluator", {self.recorder.counts: steps, **row}, step=steps)
        self.recorder.extra["eval_return_mean"] = row["eval_return_mean"]

    def maybe_run(self, source) -> None:
        """Evaluate if due, with the parameters of ``source`` (a VariableSource: the learner)."""
        steps = self.due()
        if steps is not None:
            self.log(steps, self.play(source))

    def close(self) -> None:
        self.play.close()


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
    meta, builder, checkpoint = load_run(run_dir)
    if (opponent is not None) != (rl_envs.family(meta["env"]) == "openspiel"):
        raise ConfigError(
            f"--opponent plays the other side of a two-player game; {meta['env']} "
            + ("is not one" if opponent is not None else "is one: name an opponent, e.g. "
               "--opponent random, mcts:200 or perfect")  # fmt: skip
        )
    if meta["runtime"] == "device":  # the device runtime plays its own (multi-agent) games
        from rlherd.runtime.device import evaluate_device

        result = evaluate_device(meta, builder, checkpoint, episodes, video, greedy, seed)
        _add_to_summary(run_dir, result)
        return result
    spec = rl_envs.spec_for(meta["env"], **meta["env_kwargs"])
    net = builder.make_networks(spec, device="cpu")
    net.load_state_dict(checkpoint["learner"]["net"])
    net.eval()
    env = rl_envs.make(
        meta["env"], render_mode="rgb_array" if video else None, **meta["env_kwargs"]
    )
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
    result = dict(**episode_stats(returns, lengths), eval_episodes=episodes, eval_greedy=greedy)
    _add_to_summary(run_dir, result)
    return result


def _add_to_summary(run_dir: str | Path, result: dict[str, Any]) -> None:
    summary_path = Path(run_dir) / "summary.json"
    summary = read_json(summary_path) if summary_path.exists() else {}
    atomic_write_json(summary_path, {**summary, **result})
