"""Evaluating a policy while it trains: the kit runtimes use to play the greedy policy's
episodes (:class:`Evaluator` in the learner's process, :class:`EvalEpisodes` on a node of its
own). It takes the agent's builder as an argument and never looks agents up by name, so runtimes
and commands can both use it."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlherd import envs as rl_envs
from rlherd.core import VariableClient, stack_obs
from rlherd.errors import ConfigError
from rlherd.replay.recording import MAX_EPISODE_STEPS

# The evaluation protocol, one for the evaluator, `rlherd eval`, `rlherd package`, the benchmarks
# and the docs' tables: the greedy policy; episode i of every evaluation seeded EVAL_SEED + i, so
# that every run, seed and agent of a comparison plays the same episodes (seeds of their own,
# never training's); each episode cut at MAX_EPISODE_STEPS (eval_episodes_cut counts those); and
# the episode count given with every result (eval_episodes). Scores in the docs are over 100.
EVAL_SEED = 1_000_000


# How many episodes an evaluation plays at once, each in its own copy of the environment: the
# policy then acts on a batch of them, which costs about what one observation costs (100
# Pendulum episodes of a D4PG policy: 5.5 s one at a time, 0.8 s sixteen at a time, on one core).
EVAL_ROWS = 16


def make_eval_envs(env_id: str, agent_index: bool, episodes: int, **kwargs: Any) -> list:
    """The environments an evaluation of ``episodes`` episodes plays in
    (:func:`rlherd.envs.make_one`): one per episode played at once, up to :data:`EVAL_ROWS`; one
    for a multi-agent game, whose agents are already its rows."""
    envs = [rl_envs.make_one(env_id, agent_index, **kwargs)]
    if not isinstance(envs[0], gym.vector.VectorEnv):
        envs += [rl_envs.make_one(env_id, agent_index, **kwargs)
                 for _ in range(min(episodes, EVAL_ROWS) - 1)]  # fmt: skip
    return envs


def close_envs(envs: list) -> None:
    """Close the environments :func:`make_eval_envs` made."""
    for env in envs:
        env.close()


def run_episodes(envs, actor, episodes: int, seed: int, record: bool = False):
    """Returns and lengths of ``episodes`` episodes of ``actor`` in ``envs`` (an environment, or
    a list of copies of it from :func:`make_eval_envs`, each playing one episode at a time, so
    that the actor acts on a batch of them), each cut after ``MAX_EPISODE_STEPS``; the frames of
    the first one if ``record``. Episode i is seeded ``seed + i`` whichever copy plays it, and
    the results are in episode order. In a multi-agent game (one game's agents as rows,
    :func:`rlherd.envs.make_one`), each agent's episode is one of them, as in training."""
    envs = envs if isinstance(envs, list) else [envs]
    if isinstance(envs[0], gym.vector.VectorEnv):
        return _game_episodes(envs[0], actor, episodes, seed)
    envs = envs[:episodes]
    if hasattr(actor, "bind_environments"):  # a search's simulator copies the environments
        actor.bind_environments(envs)
    returns, lengths, frames = [0.0] * episodes, [0] * episodes, []
    playing: list[int | None] = list(range(len(envs)))  # each copy's episode; None: done
    obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    actor.observe_first(stack_obs(obs), np.ones(len(envs), dtype=bool))
    upcoming = len(envs)
    while any(episode is not None for episode in playing):
        if record and playing[0] == 0:
            frames.append(_render(envs[0]))
        actions = actor.select_action(stack_obs(obs))
        first = np.zeros(len(envs), dtype=bool)
        for row, episode in enumerate(playing):
            if episode is None:  # its last observation stays in the batch; its action is unused
                continue
            obs[row], reward, terminated, truncated, _ = envs[row].step(actions[row])
            returns[episode] += float(reward)
            lengths[episode] += 1
            if terminated or truncated or lengths[episode] >= MAX_EPISODE_STEPS:
                playing[row] = None
                if upcoming < episodes:  # the copy plays the next episode not yet begun
                    obs[row], _ = envs[row].reset(seed=seed + upcoming)
                    playing[row], first[row], upcoming = upcoming, True, upcoming + 1
        if first.any():
            actor.observe_first(stack_obs(obs), first)
    return returns, lengths, frames


def _game_episodes(game, actor, episodes: int, seed: int):
    """Each agent's return and length in ``episodes`` games of ``game`` (one game's agents as
    rows), with no frames. An agent's episode is its time in the game: it ends when the agent
    is done, and its steps away (``game.absent``) add nothing."""
    returns, lengths = [], []
    everyone = np.ones(game.num_envs, dtype=bool)
    for episode in range(episodes):
        obs, _ = game.reset(seed=seed + episode)
        actor.observe_first(obs, everyone)
        done, ret = np.zeros_like(everyone), np.zeros(game.num_envs)
        length, steps = np.zeros(game.num_envs, dtype=np.int64), 0
        absent = getattr(game, "absent", np.zeros_like(everyone))  # agents away (AgentRows)
        while not (done | absent).all() and steps < MAX_EPISODE_STEPS:
            playing = ~(done | absent)
            obs, reward, terminated, truncated, _ = game.step(actor.select_action(obs))
            ret, length, steps = ret + reward * playing, length + playing, steps + 1
            done |= (terminated | truncated) & playing
            absent = getattr(game, "absent", absent)
        returns += ret.tolist()
        lengths += length.tolist()
    return returns, lengths, []


def _render(env) -> np.ndarray:
    """A frame of ``env``, without Gymnasium's checker warning (on the first frame) that it is not
    uint8 or that the environment declares no frame rate (MinAtar's frames are both): a video
    takes frames of any dtype (:func:`~rlherd.run.video.as_video`) and has its own rate. An
    environment that draws nothing (its ``render()`` returns None, or is Gymnasium's, which
    raises NotImplementedError) is one line at its first frame, not the video writer's error
    on a frame of shape () after every episode, or a traceback."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(No render fps|RGB-array rendering should)")
        try:
            frame = env.render()
        except NotImplementedError:
            raise _draws_nothing(env, " has no render()") from None
    if np.ndim(frame) < 2:
        raise _draws_nothing(env, f"'s render() returned {frame!r:.40} in render_mode "
                                  "'rgb_array', not an image")  # fmt: skip
    return frame


def _draws_nothing(env, what: str) -> ConfigError:
    """The line for an environment with no frames to record; ``what`` follows its name."""
    name = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
    return ConfigError(f"{name}{what}; it draws no frames to record: drop --video, or "
                       "return an image from its render()")


def episode_stats(
    returns: list[float], lengths: list[int], policies: list[str] | None = None
) -> dict[str, float]:
    """What an evaluation reports of its episodes, with how many were cut at the step limit.
    A game of several policies (``policies``: each episode's) reports each one's mean return
    (``eval_return_adversary``, ...), never their average."""
    out = dict(
        eval_return_mean=float(np.mean(returns)),
        eval_return_std=float(np.std(returns)),
        eval_episode_length_mean=float(np.mean(lengths)),
        eval_episodes_cut=int(np.sum(np.asarray(lengths) >= MAX_EPISODE_STEPS)),
    )
    names = list(dict.fromkeys(policies or []))
    if len(names) > 1:
        del out["eval_return_mean"], out["eval_return_std"]
        values = np.asarray(returns)
        for name in names:
            out[f"eval_return_{name}"] = float(values[np.asarray(policies) == name].mean())
    return out


def episode_policies(envs, actor, episodes: int) -> list[str] | None:
    """The policy of each episode :func:`run_episodes` returns in ``envs``, where ``actor``
    acts for several (:class:`rlherd.agents.groups.GroupActor`); else None."""
    env = envs[0] if isinstance(envs, list) else envs
    if not isinstance(env, gym.vector.VectorEnv) or not hasattr(actor, "row_policies"):
        return None
    return actor.row_policies(env.num_envs) * episodes


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
        self.envs = make_eval_envs(env_id, getattr(spec, "agent_index", False), episodes,
                                   **env_kwargs)  # fmt: skip

    def __call__(self, source) -> dict[str, float]:
        """Play with the parameters of ``source`` (a VariableSource); the evaluator.csv columns."""
        VariableClient(source, self.net).update(wait=True)
        actor = eval_actor(self.builder, self.spec, self.net, True, self.seed)
        returns, lengths, _ = run_episodes(self.envs, actor, self.episodes, self.seed)
        stats = episode_stats(returns, lengths, episode_policies(self.envs, actor, self.episodes))
        return dict(**stats, eval_episodes=self.episodes)

    def close(self) -> None:
        close_envs(self.envs)


class Evaluator:
    """Runs the evaluation policy (greedy) for ``episodes`` episodes every ``every_steps`` steps
    of what the run counts (actor steps; learner steps offline; :class:`EvalEpisodes`), and
    once more at the run's end unless the latest was already there, so that a run's
    ``eval_return_mean`` is always its final policy's, whether or not ``every_steps`` divides
    the budget; it logs ``metrics/evaluator.csv`` and ``eval_return_mean``.
    It has no adder: it never writes to replay, and it never changes the training actors' RNG
    streams."""

    def __init__(self, builder, spec, env_id, env_kwargs, recorder, every_steps, episodes):
        self.recorder, self.every_steps = recorder, every_steps
        self.play = EvalEpisodes(builder, spec, env_id, env_kwargs, episodes, EVAL_SEED)
        steps = int(recorder.counters[recorder.counts])
        self.next_at = (steps // every_steps + 1) * every_steps
        self.last_at = -1  # the steps of this process's latest evaluation

    def due(self, end: bool = False) -> int | None:
        """The steps now, if an evaluation is due (the next is then scheduled); at the run's
        ``end``, one is due unless the latest was at or past the budget, or (a run its episodes
        ended) at these steps."""
        steps = int(self.recorder.counters[self.recorder.counts])
        final = end and self.last_at < min(steps, self.recorder.total_steps)
        if steps < self.next_at and not final:
            return None
        self.next_at = (steps // self.every_steps + 1) * self.every_steps
        self.last_at = steps
        return steps

    def log(self, steps: int, row: dict[str, float],
            policy: Callable[[], dict[str, Any]]) -> None:  # fmt: skip
        """Log an evaluation at ``steps`` and tell the run's callbacks, to whom ``policy()``
        gives the evaluated parameters."""
        results = {self.recorder.counts: steps, **row}
        self.recorder.rundir.log("evaluator", results, step=steps)
        self.recorder.extra.update({k: v for k, v in row.items() if k == "eval_episodes" or (
            k.startswith("eval_return_") and k != "eval_return_std")})  # fmt: skip
        if self.recorder.callbacks is not None:
            self.recorder.callbacks.on_eval(results, policy)

    def maybe_run(self, source, end: bool = False) -> None:
        """Evaluate if due (see :meth:`due`), with the parameters of ``source`` (a
        VariableSource: the learner)."""
        steps = self.due(end)
        if steps is not None:
            self.log(steps, self.play(source), self.play.net.state_dict)

    def close(self) -> None:
        self.play.close()


class Snapshots:
    """A self-play run's past selves on disk: every ``every`` steps (the ``opponent_every``
    setting, as the actors' opponent pools snapshot theirs), the policy's parameters from its
    variable source go to ``snapshots/`` in the run directory, for ``rlherd eval --opponent
    snapshot:K`` and the rating table."""

    def __init__(self, recorder, every: int):
        self.recorder, self.every = recorder, every
        steps = int(recorder.counters[recorder.counts])
        self.next_at = 0 if steps == 0 else (steps // every + 1) * every

    def maybe_save(self, source) -> None:
        steps = int(self.recorder.counters[self.recorder.counts])
        if steps >= self.next_at:
            (policy,) = source.get_variables(["policy"])
            self.recorder.rundir.save_snapshot(policy, steps)
            self.next_at = (steps // self.every + 1) * self.every
