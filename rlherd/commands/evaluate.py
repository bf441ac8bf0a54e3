"""``rlherd eval``: run a trained policy for a number of episodes, optionally recording a video."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlherd import envs as rl_envs
from rlherd import types as F
from rlherd.agents import BUILDERS
from rlherd.agents.groups import for_policies
from rlherd.config import apply_overrides, check_seed
from rlherd.core import POLICY_KEY, policy_state, stack_obs
from rlherd.errors import ConfigError
from rlherd.run.evaluation import (
    EVAL_SEED,
    close_envs,
    episode_policies,
    episode_stats,
    eval_actor,
    make_eval_envs,
    run_episodes,
)
from rlherd.run.package import POLICY_FILE, is_package, read_package
from rlherd.run.ratings import record_games
from rlherd.run.rundir import RunDir, RunRecord, check_parts, fitting
from rlherd.run.video import check_writable, write_video
from rlherd.runtime import RUNTIMES
from rlherd.types import batch_of_one


def load_run(run_dir: str | Path,
             best: bool = False) -> tuple[RunRecord, Any, dict[str, Any], Path]:  # fmt: skip
    """A finished or running run: its record, its agent's builder, its latest checkpoint and the
    file its policy comes from (named by a message that it does not fit the run), each checked
    (with summary.json) before anything runs. With ``best``, the checkpoint's policy is the best
    evaluation's (``best/policy.pt``, kept by ``--save-best``). A package (``rlherd package``)
    is read as one: its checkpoint holds the policy and its step counters
    (:func:`rlherd.run.package.read_package`)."""
    if is_package(run_dir):
        if best:
            raise ConfigError(f"{run_dir} is a package, which holds one policy: drop --best")
        record, checkpoint = read_package(run_dir)
        return record, builder_of(record, Path(run_dir)), checkpoint, Path(run_dir) / POLICY_FILE
    rundir = RunDir(run_dir)
    record = rundir.read_config()
    rundir.read_summary()
    checkpoint = rundir.load_checkpoint()
    check_parts(checkpoint, rundir.loaded)
    source = rundir.loaded
    if best:
        checkpoint["learner"] = {**checkpoint["learner"], POLICY_KEY: rundir.load_best()}
        source = rundir.path / "best" / "policy.pt"
    return record, builder_of(record, rundir.path), checkpoint, source


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


def run_spec(record: RunRecord):
    """The spec a run's networks were built for: its environment's, with the run's mapping of a
    game's agents to policies and, if set, each agent's index among its inputs."""
    spec = rl_envs.spec_for(record.env, **record.env_kwargs)
    return rl_envs.with_policies(spec, record.settings.get("policies", ""),
                                 record.settings.get("agent_index", False),
                                 **record.env_kwargs)  # fmt: skip


def policy_network(record: RunRecord, builder, learner_state: dict[str, Any], source: Path):
    """The run's builder for its policies, its environment's spec and its networks holding the
    policy in a checkpoint's ``learner_state`` (read from ``source``, named if it does not fit:
    :func:`~rlherd.run.rundir.fitting`), in evaluation mode."""
    spec = run_spec(record)
    builder = for_policies(builder, spec, record.settings.get("policy_overrides", {}))
    net = builder.make_networks(spec, device="cpu")
    with fitting(source):
        net.load_state_dict(policy_state(learner_state))
    net.eval()
    return builder, spec, net


def play_against(envs: list, actor, opponent, games: int) -> dict[str, float]:
    """``games`` games of a two-player OpenSpiel game between ``actor`` and ``opponent``
    (:mod:`rlherd.envs.openspiel`), the actor moving first in every other game (game g: seat
    g % 2, seeded g): its win, draw and loss rates, overall and as the first and second player.

    ``envs`` are copies of the game's environment (:func:`make_eval_envs`), each playing one
    game at a time, so that the actor searches the positions of several games as one batch:
    the opponent moves in each copy until the actor is to move in all of them. A copy whose
    game has ended and that has no game left to play is observed as ended, which a search
    skips, as the environment loop's actors skip an ended environment."""
    envs = envs[:games]
    actor.bind_environments(envs)
    outcomes: dict[int, list[float]] = {0: [], 1: []}
    playing = list(range(len(envs)))  # each copy's game: first games 0, 1, ...
    obs = [env.reset(seed=g)[0] for g, env in enumerate(envs)]
    upcoming = iter(range(len(envs), games))

    def move(row: int, action: int) -> bool:
        """Play ``action`` in copy ``row``; True if it ended the game (then scored)."""
        game, me = envs[row].unwrapped, playing[row] % 2
        obs[row], _, terminated, _, _ = envs[row].step(action)
        if terminated:
            outcomes[me].append(float(game.state.returns()[me]))
        return terminated

    def opponent_moves(row: int) -> bool:
        """The opponent's moves in copy ``row`` until the actor is to move; True if they ended
        the game."""
        game, me = envs[row].unwrapped, playing[row] % 2
        while game.current_player != me:
            if move(row, opponent(game)):
                return True
        return False

    def next_game(row: int) -> bool:
        """Start games in copy ``row`` until one reaches the actor's move; False if none is
        left."""
        for g in upcoming:
            playing[row] = g
            obs[row], _ = envs[row].reset(seed=g)
            if not opponent_moves(row):
                return True
        return False

    live = np.array([not opponent_moves(row) or next_game(row) for row in range(len(envs))])
    actor.observe_first(stack_obs(obs), live)
    actions, started, no = np.zeros(len(envs), np.int64), np.zeros_like(live), np.zeros_like(live)
    while live.any():
        # The actor hears which copies are done (it skips them) and which began a game.
        batch = stack_obs(obs)
        actor.observe(actions, np.zeros(len(envs)), batch, ~live | started, no, no)
        if started.any():
            actor.observe_first(batch, started)
        actions, started = actor.select_action(batch), np.zeros_like(live)
        for row in np.flatnonzero(live):
            if move(row, actions[row]) or opponent_moves(row):
                started[row] = live[row] = next_game(row)
    return rates(outcomes[0], outcomes[1])


def rates(first: list[float], second: list[float]) -> dict[str, float | None]:
    """Win, draw and loss rates of returns +1, 0 and -1: overall, and moving first and second;
    None for a seat that played no game (one game plays one seat), not a rate of 0."""
    result: dict[str, float | None] = {}
    for name, scores in (("", first + second), ("first_", first), ("second_", second)):
        scores_ = np.sign(np.asarray(scores))
        for outcome, value in (("win", 1.0), ("draw", 0.0), ("loss", -1.0)):
            result[f"{name}{outcome}_rate"] = float(np.mean(scores_ == value)) if scores else None
    return result


def turn_opponent(name: str, run_dir: Path, env_id: str, builder, spec, seed: int):
    """The opponent ``rlherd eval --opponent`` names for a turn-based PettingZoo game, and its
    name in the rating table: ``random``; ``latest`` (the run's latest policy, sampling);
    ``snapshot:K`` (its policy at step ``K``: ``snapshots/``); ``mcts:N`` (OpenSpiel's bot)."""
    from rlherd.envs.turns import PolicyMoves, RandomMoves, SpielMoves

    rundir = RunDir(run_dir)
    if name == "random":
        return RandomMoves(seed), "random"
    if name == "latest" or name.startswith("snapshot:") and name[9:].isdigit():
        net = builder.make_networks(spec, device="cpu")
        if name == "latest":
            checkpoint = rundir.load_checkpoint()
            check_parts(checkpoint, rundir.loaded)
            with fitting(rundir.loaded):
                net.load_state_dict(policy_state(checkpoint["learner"]))
                step = int(checkpoint["recorder"]["counters"]["actor_steps"])
        else:
            step = int(name[9:])
            policy = rundir.load_snapshot(step)
            with fitting(rundir.snapshot_file(step)):
                net.load_state_dict(policy)
        return PolicyMoves(builder.make_policy(net), seed), f"step:{step}"
    if name.startswith("mcts:") and name[5:].isdigit() and int(name[5:]) > 0:
        return SpielMoves(env_id, int(name[5:]), seed), name
    raise ConfigError(f"unknown opponent {name!r}; use random, latest, snapshot:K (a step in "
                      f"{rundir.snapshots() or 'its snapshots/'}) or mcts:N")  # fmt: skip


def play_turns(record: RunRecord, run_dir: Path, actor, player: str, opponent: str,
               builder, spec, games: int, seed: int) -> dict[str, Any]:  # fmt: skip
    """``games`` games of a turn-based PettingZoo game between ``actor`` (the run's policy,
    named ``player``) and ``opponent``, the actor taking the first seat in every other game:
    its win, draw and loss rates, overall and by seat; the games go to the run's rating table
    (:mod:`rlherd.run.ratings`)."""
    from rlherd.envs.pettingzoo import game_module
    from rlherd.envs.turns import TurnGames

    rival, rival_name = turn_opponent(opponent, run_dir, record.env, builder, spec, seed)
    env = TurnGames(record.env, game_module(record.env), games, rival, repeat=False,
                    **record.env_kwargs)  # fmt: skip
    obs, _ = env.reset(seed=seed)
    actor.observe_first(obs, np.ones(games, dtype=bool))
    while not env.over.all():
        obs, *_ = env.step(actor.select_action(obs))
    env.close()
    seats, outcomes = env.seat.copy(), env.outcome.copy()
    result = dict(opponent=opponent, games=games,
                  **rates(outcomes[seats == 0].tolist(), outcomes[seats == 1].tolist()))
    if rival_name != player:  # a policy against itself says nothing of its rating
        ratings = record_games(Path(run_dir), [
            (player, rival_name, int(s), float(np.sign(o) + 1) / 2)
            for s, o in zip(seats, outcomes, strict=True)])  # fmt: skip
        result["elo_difference"] = round(ratings[player] - ratings[rival_name], 1)
    return result


def evaluate(
    run_dir: str | Path,
    episodes: int = 10,
    video: str | Path | None = None,
    greedy: bool = True,
    seed: int = EVAL_SEED,
    opponent: str | None = None,
    best: bool = False,
) -> dict[str, Any]:
    """Mean return of the run's latest policy (``best``: its best evaluation's, kept by
    ``--save-best``) over ``episodes`` episodes; the first episode is recorded to ``video``
    (.gif or .mp4) if given. The result is added to summary.json as ``eval_return_mean``
    (``best_eval_return_mean`` with ``best``, ``sampled_eval_return_mean`` without
    ``greedy``). In a two-player game, ``opponent`` plays the other side of ``episodes`` games,
    and the result holds the win, draw and loss rates: an OpenSpiel game's ``random``,
    ``mcts:N`` or ``perfect`` (:func:`play_against`), a turn-based PettingZoo game's
    ``random``, ``latest``, ``snapshot:K`` or ``mcts:N`` (:func:`play_turns`, which also rates
    the players). A package (``rlherd package``) is read, never written."""
    if episodes < 1:
        raise ConfigError(f"episodes must be >= 1, got {episodes}")
    if video:  # before the episodes are played, not after
        check_writable(Path(video))
    record, builder, checkpoint, source = load_run(run_dir, best)
    _check_opponent(record.env, opponent)
    runtime = RUNTIMES.get(record.runtime)
    if runtime is not None and "gym_envs" not in runtime.provides:
        # A runtime with environments of its own (device) evaluates its runs; the others'
        # runs play here, without importing their runtime (a Ray run evaluates without Ray).
        own = runtime.hook("evaluate")
        if own is None:
            raise ConfigError(f"the {record.runtime} runtime cannot evaluate its runs (its "
                              f"module {runtime.module} has no evaluate())")  # fmt: skip
        result = own(record, builder, checkpoint, source, episodes, video, greedy, seed)
        _add_to_summary(run_dir, result)
        return result
    builder, spec, net = policy_network(record, builder, checkpoint["learner"], source)
    if video and rl_envs.family(record.env) == "pettingzoo":
        raise ConfigError(f"--video records one agent's episode; {record.env} is a multi-agent "
                          "game, which rlherd does not record yet: drop --video")  # fmt: skip
    # A run trained with a render mode of its own among its options records in rgb_array.
    kwargs = dict(record.env_kwargs, render_mode="rgb_array") if video else record.env_kwargs
    actor = eval_actor(builder, spec, net, greedy, seed)
    if opponent is not None:
        results = _versus(opponent, run_dir, record, kwargs, actor, checkpoint, builder, spec,
                          episodes, seed)  # fmt: skip
        _add_to_summary(run_dir, results)
        return results if opponent == "snapshots" else results[f"vs_{opponent}"]
    envs = make_eval_envs(record.env, spec.agent_index, episodes, **kwargs)
    try:
        returns, lengths, frames = run_episodes(envs, actor, episodes, seed, record=bool(video))
    finally:
        close_envs(envs)
    if video:
        write_video(Path(video), frames)
    policies = episode_policies(envs, actor, episodes)
    result = dict(**episode_stats(returns, lengths, policies), eval_episodes=episodes,
                  eval_greedy=greedy)  # fmt: skip
    # The summary's eval_return_mean is the latest policy's greedy score (rlherd report reads
    # it): the best policy's and sampled actions' go beside it, under their own names.
    prefix = ("best_" if best else "") + ("" if greedy else "sampled_")
    _add_to_summary(run_dir, {f"{prefix}{k}": v for k, v in result.items()})
    return result


def _check_opponent(env_id: str, opponent: str | None) -> None:
    """``--opponent`` is given for a two-player game, and for nothing else."""
    turns = rl_envs.turn_based(env_id)
    if (opponent is not None) != (rl_envs.family(env_id) == "openspiel" or turns):
        examples = "random, latest, snapshot:K or mcts:200" if turns else (
            "random, mcts:200 or perfect")  # fmt: skip
        raise ConfigError(
            f"--opponent plays the other side of a two-player game; {env_id} "
            + ("is not one" if opponent is not None else f"is one: name an opponent, e.g. "
               f"--opponent {examples}")  # fmt: skip
        )


def _versus(opponent: str, run_dir: str | Path, record: RunRecord, env_kwargs: dict[str, Any],
            actor: Any, checkpoint: dict[str, Any], builder: Any, spec: Any, episodes: int,
            seed: int) -> dict[str, dict[str, Any]]:  # fmt: skip
    """The games of the run's policy against ``opponent`` (``snapshots``: each of the run's
    snapshots in turn), by rival: ``vs_<rival>``'s win, draw and loss rates. An OpenSpiel
    game is played in copies made with ``env_kwargs``; a turn-based PettingZoo game makes its
    own (:func:`play_turns`)."""
    if not rl_envs.turn_based(record.env):  # an OpenSpiel game, played in copies of it
        from rlherd.envs.openspiel import make_opponent

        envs = make_eval_envs(record.env, spec.agent_index, episodes, **env_kwargs)
        try:
            rival = make_opponent(opponent, envs[0].unwrapped.game, seed)
            rates = play_against(envs, actor, rival, episodes)
        finally:
            close_envs(envs)
        return {f"vs_{opponent}": dict(opponent=opponent, games=episodes, **rates)}
    # The policy is the checkpoint's, so its step is the checkpoint's (a run may go on).
    player = f"step:{int(checkpoint['recorder']['counters']['actor_steps'])}"
    rivals = [opponent]
    if opponent == "snapshots":  # every past self in turn: the rating table across them
        rivals = [f"snapshot:{k}" for k in RunDir(run_dir).snapshots()]
        if not rivals:
            raise ConfigError(f"{run_dir} has no snapshots/ (a self-play run keeps one "
                              "every opponent_every steps)")  # fmt: skip
    return {f"vs_{rival}": play_turns(record, Path(run_dir), actor, player, rival, builder, spec,
                                      episodes, seed) for rival in rivals}  # fmt: skip


class TrainedPolicy:
    """A run's latest policy, to act with from Python (analysis, a notebook, an environment of
    one's own), made by :func:`load_policy`. ``policy(obs)`` acts for one observation, or a
    batch of them (a leading dimension), as the run's agent acts: its greedy action unless made
    with ``greedy=False``. Observations are as :func:`rlherd.make` gives them (a Dict, Tuple or
    MultiBinary one as a dict of arrays). A recurrent policy carries its state from call to call;
    ``reset()`` begins new episodes (a new batch size does too).

    Example::

        policy = rlherd.load_policy("runs/ppo-cartpole")
        env = rlherd.make("CartPole-v1")
        obs, _ = env.reset(seed=0)
        obs, reward, terminated, truncated, _ = env.step(policy(obs))
    """

    def __init__(self, make_actor: Callable[[], Any], spec: Any, record: RunRecord):
        self.make_actor, self.spec, self.record = make_actor, spec, record
        self.actor: Any = None
        self.rows: int | None = None

    def reset(self, rows: int = 1) -> None:
        """Begin new episodes in ``rows`` environments (a fresh actor: its recurrent state,
        its random stream)."""
        self.actor = self.make_actor()
        if hasattr(self.actor, "policy"):  # what act() reads the policy's outputs from
            self.actor.policy = _KeepOutputs(self.actor.policy)
        self.actor.observe_first(None, np.ones(rows, dtype=bool))
        self.rows = rows

    def __call__(self, obs: Any) -> np.ndarray:
        actions, single = self._select(obs)
        return actions[0] if single else actions

    def _select(self, obs: Any) -> tuple[np.ndarray, bool]:
        """The actions for ``obs`` as a batch, and whether ``obs`` was one observation."""
        single = self._single(obs)
        _check_finite(obs)
        batch = batch_of_one(obs) if single else obs
        rows = F.obs_len(batch)
        if rows != self.rows:
            self.reset(rows)
        return self.actor.select_action(batch), single

    def _single(self, obs: Any) -> bool:
        """Whether ``obs`` is one observation (else a batch of them); one line naming the
        shapes the policy reads where it is neither (the network's own error was torch's, an
        environment's raw Tuple observation numpy's)."""
        leaves = self.spec.obs if self.spec.structured else {"": self.spec.obs}
        want = {key: tuple(leaf.shape) for key, leaf in leaves.items()}
        got = _shapes_of(obs) if self.spec.structured == isinstance(obs, dict) else None
        if got == want:
            return True
        rows = {shape[0] for shape in (got or {}).values() if shape}
        if got is not None and set(got) == set(want) and len(rows) == 1 and all(
                got[key][1:] == shape for key, shape in want.items()):  # fmt: skip
            return False
        env = self.record.env
        given = _shapes(got) if got is not None else _kind(obs)
        raise ConfigError(f"{self.record.agent}'s policy on {env} reads observations as "
                          f"rlherd.make({env!r}) gives them: one of {_shapes(want)}, or a batch "
                          f"of them (a leading dimension); got {given}")  # fmt: skip

    def act(self, obs: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The action for ``obs`` (one observation or a batch) and what the policy computed
        to choose it, as arrays named as the agent's rollouts and transitions name them
        (:mod:`rlherd.types`): e.g. PPO's ``policy_params`` (logits, or a Gaussian's mean and
        log std) and ``baseline`` (its value), IMPALA's ``policy_logits`` and ``baseline``,
        DQN's and R2D2's ``q_values``."""
        actions, single = self._select(obs)
        policy = getattr(self.actor, "policy", None)
        if not isinstance(policy, _KeepOutputs):
            raise ConfigError(f"{self.record.agent} with several policies acts through each; "
                              "act() reads one policy's outputs (--policies shared)")  # fmt: skip
        outputs = {k: v.detach().cpu().numpy() for k, v in policy.outputs.items()
                   if isinstance(v, torch.Tensor) and k != F.ACTION}  # fmt: skip
        if single:
            return actions[0], {k: v[0] for k, v in outputs.items()}
        return actions, outputs


def _check_finite(obs: Any) -> None:
    """Refuse an observation holding NaN or inf (a sensor's dropout, a division by zero
    upstream): the network turns it into NaN outputs, which an argmax reads as action 0."""
    for key, value in (obs.items() if isinstance(obs, dict) else [("", obs)]):
        array = np.asarray(value)
        if array.dtype.kind in "fc" and not np.isfinite(array).all():
            where = f"{key!r} " if key else ""
            raise ConfigError(f"the observation {where}holds NaN or inf values; a policy's "
                              "action on it means nothing: clean it before acting")  # fmt: skip


def _shapes(shapes: dict[str, tuple]) -> str:
    """``shape (4,)``, or ``shapes {'image': (7, 7, 3), ...} (a dict of arrays)`` for a dict
    observation's."""
    return f"shape {shapes['']}" if list(shapes) == [""] else f"shapes {shapes} (a dict of arrays)"


def _shapes_of(obs: Any) -> dict[str, tuple] | None:
    """The shape of ``obs`` (``""``'s), or of each of its arrays by key; None where one is no
    array (a raw Tuple observation's tuple, which numpy cannot shape)."""
    try:
        if isinstance(obs, dict):
            return {key: np.shape(value) for key, value in obs.items()}
        return {"": np.shape(obs)}
    except ValueError:
        return None


def _kind(obs: Any) -> str:
    """What an observation of the wrong structure is: its type, and its keys or shape."""
    if isinstance(obs, dict):
        return f"a dict of {sorted(map(str, obs))}"
    shapes = _shapes_of(obs)
    return f"a {type(obs).__name__} object" + (f" of shape {shapes['']}" if shapes else "")


class _KeepOutputs:
    """A policy that keeps its latest outputs, for :meth:`TrainedPolicy.act`; otherwise the
    policy itself (its attributes are the policy's)."""

    def __init__(self, policy: Any):
        self.policy, self.outputs = policy, {}

    def __call__(self, *args: Any) -> Any:
        outputs, state = self.policy(*args)
        self.outputs = outputs
        return outputs, state

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)


def load_policy(run_dir: str | Path, greedy: bool = True, seed: int = 0,
                best: bool = False) -> TrainedPolicy:  # fmt: skip
    """The latest policy of the run in ``run_dir`` (a finished or running one; ``best``: its
    best evaluation's, kept by ``--save-best``), read as plain data from its checkpoint: see
    :class:`TrainedPolicy`. Runs of the device runtime (whose games live on the device), of
    agents that act by searching their environment (MCTS) and of games of several policies
    (each acts for its own agents, which one observation does not say) are played with
    ``rlherd eval`` instead. ``run_dir`` may be a package (rlherd package)."""
    trained = run_policy(run_dir, greedy, seed, best)
    policies = sorted(set(trained.spec.policies))
    if len(policies) > 1:
        raise ConfigError(f"{run_dir} trains {len(policies)} policies ({', '.join(policies)}), "
                          "each acting for its own agents of a game, which load_policy's "
                          "observations do not say; play it with rlherd eval (or train one "
                          "policy: --policies shared)")  # fmt: skip
    return trained


def run_policy(run_dir: str | Path, greedy: bool = True, seed: int = 0,
               best: bool = False) -> TrainedPolicy:  # fmt: skip
    """:func:`load_policy`'s policy, a game of several policies' too, whose actor rlherd's own
    players (``rlherd package``'s score) step over whole games, agent by agent, as eval does."""
    check_seed(seed)
    record, builder, checkpoint, source = load_run(run_dir, best)
    runtime = RUNTIMES.get(record.runtime)
    if runtime is None or "gym_envs" not in runtime.provides:
        raise ConfigError(f"{run_dir} is a {record.runtime} run, whose games live in its "
                          "runtime; play it with rlherd eval")  # fmt: skip
    if "actor_network" in builder.needs:
        raise ConfigError(f"{record.agent} acts by searching its environment, which a policy "
                          "alone cannot; play it with rlherd eval")  # fmt: skip
    builder, spec, net = policy_network(record, builder, checkpoint["learner"], source)
    return TrainedPolicy(lambda: eval_actor(builder, spec, net, greedy, seed), spec, record)


def _add_to_summary(run_dir: str | Path, result: dict[str, Any]) -> None:
    if is_package(run_dir):  # shared as it was made (perhaps read-only, a download): not written
        return
    rundir = RunDir(run_dir)
    rundir.check_links()
    rundir.write_summary({**rundir.read_summary(), **result})
