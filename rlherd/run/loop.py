"""The environment loop: TensorFlow Agents' ``simulate`` over a batch of environments.

:class:`EnvironmentLoop` steps a vector environment with a
:class:`~rlherd.core.BatchedAlgorithm` (``begin_episodes`` / ``perform`` / ``experience`` /
``end_episodes``). It follows Gymnasium's next-step autoreset: the step after an episode ended
only resets that environment, so it is passed to ``experience`` as ``skip`` (not a transition)
and the environment begins its next episode; so is a step of a multi-agent game's row whose
agent is away (``envs.absent``: it left, or has not joined yet). Episode returns and lengths
(counted by the one :class:`~rlherd.run.counting.EpisodeTracker`) and step counts go to the
run's recorder, or to anything with its ``add_actor_steps`` and ``episodes`` methods (a ``mono``
actor process sends them to the learner's).

:class:`ActorAlgorithm` is that interface built from rlherd's seams: an
:class:`~rlherd.core.Actor` acts and records, and a :class:`~rlherd.core.Learner` steps whenever
its dataset has a batch ready (full rollouts for on-policy agents, the rate limiter's say for
replay agents).
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rlherd import types as F
from rlherd.core import Actor, BatchedAlgorithm
from rlherd.envs import continue_envs, env_progress, save_envs
from rlherd.errors import Notice
from rlherd.run.counting import EpisodeTracker
from rlherd.run.plain import key_path, seal, unseal
from rlherd.run.recorder import Recorder


class SnapshotNotice(Notice):
    """A run resumes without its environments' snapshot (it was written on another machine, or
    does not load)."""


class ActorAlgorithm:
    """A :class:`~rlherd.core.BatchedAlgorithm` made of an actor and (optionally) a learner.

    ``begin_episodes`` becomes ``actor.observe_first`` with the next observations, ``perform``
    is ``actor.select_action``, ``experience`` is ``actor.observe`` followed by as many
    ``learner.step()`` calls as ``ready()`` allows (the learner's dataset has a batch; each
    step's metrics go to ``on_learn``) and ``actor.update()``. Episode ends reach the actor
    through the flags.
    """

    def __init__(
        self,
        actor: Actor,
        learner=None,
        ready: Callable[[], bool] | None = None,
        on_learn: Callable[[dict[str, float]], None] | None = None,
    ):
        self.actor, self.learner, self.ready, self.on_learn = actor, learner, ready, on_learn
        self._beginning: np.ndarray | None = None

    def begin_episodes(self, indices: np.ndarray) -> None:
        self._beginning = indices

    def perform(self, obs: np.ndarray) -> np.ndarray:
        if self._beginning is not None:
            envs = np.zeros(F.obs_len(obs), dtype=bool)
            envs[self._beginning] = True
            self.actor.observe_first(obs, envs)
            self._beginning = None
        return self.actor.select_action(obs)

    def experience(self, obs, action, reward, next_obs, terminated, truncated, skip) -> None:
        self.actor.observe(action, reward, next_obs, terminated, truncated, skip=skip)
        if self.learner is not None:
            while self.ready():
                metrics = self.learner.step()
                if self.on_learn is not None:
                    self.on_learn(metrics)
        self.actor.update()

    def end_episodes(self, indices: np.ndarray) -> None:
        """Actors see episode ends in ``observe``'s flags; nothing more to do."""


class EnvironmentLoop:
    """Steps ``envs`` with ``algorithm`` (an Actor is wrapped in :class:`ActorAlgorithm`)."""

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        algorithm: BatchedAlgorithm | Actor,
        recorder: Recorder | None = None,
        seed: int | None = None,
    ):
        if not isinstance(algorithm, BatchedAlgorithm):
            algorithm = ActorAlgorithm(algorithm)
        self.envs, self.algorithm, self.recorder = envs, algorithm, recorder
        self.bind()
        obs, _ = envs.reset(seed=seed)
        self.obs = F.map_obs(np.asarray, obs)
        n = envs.num_envs
        self.beginning = np.ones(n, dtype=bool)  # these begin an episode at the next step
        self.resetting = np.zeros(n, dtype=bool)  # this env's next step is an autoreset
        self.episodes = EpisodeTracker(np.zeros(n), np.zeros(n, dtype=np.int64))
        # Rows that make one environment step: a multi-agent game's agents (its AgentRows).
        self.rows_per_step = getattr(envs, "agents_per_game", 1)
        # Each row's policy, where the actor acts for several (a game's returns are per policy).
        actor = getattr(self.algorithm, "actor", self.algorithm)
        row_policies = getattr(actor, "row_policies", None)
        self.policies = None if row_policies is None else np.asarray(row_policies(n), object)

    def bind(self) -> None:
        """Hand an actor that asks (``bind_environments``: a search's simulator) the environments
        it plays, one per row: Gymnasium's in-process ones, or None where they live elsewhere
        (BatchEnv processes, ale-py's native vector env, environment servers); and hand a
        self-play game (``bind_policy``: :mod:`rlherd.envs.turns`) the actor's policy, whose
        past selves it plays against."""
        actor = getattr(self.algorithm, "actor", self.algorithm)
        bind = getattr(actor, "bind_environments", None)
        if bind is not None:
            envs = self.envs.envs if isinstance(self.envs, gym.vector.SyncVectorEnv) else None
            bind(envs)
        bind_policy = getattr(self.envs, "bind_policy", None)  # self-play: past selves play
        if bind_policy is not None and hasattr(actor, "policy"):
            bind_policy(actor.policy)

    def step(self) -> int:
        """One step of every environment; returns the number of environment steps taken."""
        if self.beginning.any():
            self.algorithm.begin_episodes(np.flatnonzero(self.beginning))
        action = self.algorithm.perform(self.obs)
        # Skipped: autoresets, and the rows of a game's agents that are away (AgentRows.absent).
        skip = self.resetting | getattr(self.envs, "absent", False)
        obs, reward, terminated, truncated, _ = self.envs.step(action)
        obs = F.map_obs(np.asarray, obs)
        reward = np.asarray(reward, dtype=np.float64)
        terminated, truncated = np.asarray(terminated), np.asarray(truncated)
        self.algorithm.experience(self.obs, action, reward, obs, terminated, truncated, skip)
        ended = self.episodes.step(reward, terminated, truncated, skip)
        if ended.any():
            self.algorithm.end_episodes(np.flatnonzero(ended))
            if self.recorder is not None:
                policies = None if self.policies is None else self.policies[ended].tolist()
                self.recorder.episodes(self.episodes.returns[ended], self.episodes.lengths[ended],
                                       policies)  # fmt: skip
        self.beginning, self.resetting, self.obs = skip, ended, obs
        n = len(skip) // self.rows_per_step  # every step counts, autoresets too (TorchBeast)
        if self.recorder is not None:  # and a game's agents' steps, those away not counted
            moves = getattr(self.envs, "moves", None)  # a turn-based game's, both players'
            agent_steps = int((~skip).sum()) if self.rows_per_step > 1 else moves or 0
            self.recorder.add_actor_steps(n, agent_steps)
        return n

    def run(self, steps: int) -> None:
        """``steps`` steps of every environment."""
        for _ in range(steps):
            self.step()

    def state_dict(self) -> dict[str, Any]:
        """The loop's state, with the environments pickled and sealed with this machine's key
        (:func:`rlherd.run.plain.seal`), or None where they cannot be pickled; beside them, as
        plain data, what environments can hand to fresh ones (:func:`rlherd.envs.env_progress`:
        a bsuite id's counts)."""
        keys = ("obs", "beginning", "resetting")
        envs = save_envs(self.envs)
        return dict(envs=None if envs is None else seal(envs),
                    progress=env_progress(self.envs), episodes=self.episodes.state_dict(),
                    **{k: getattr(self, k) for k in keys})  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore, and say whether the environments go on where they were: restored whole, or
        fresh but given their plain-data progress (a bsuite id's counts, so its CSV goes on).
        Where they could not be saved (ale-py), or their snapshot does not load, the fresh ones'
        episodes all begin at the next step."""
        envs = None if state["envs"] is None else _unpickled(state["envs"])
        if envs is None:
            progress = state.get("progress")  # absent from checkpoints of older versions
            if progress is not None:
                continue_envs(self.envs, progress)
            return progress is not None
        self.envs.close()
        self.envs = envs
        self.bind()
        self.episodes.load_state_dict(state["episodes"])
        for k in ("obs", "beginning", "resetting"):
            setattr(self, k, state[k])
        return True


def _unpickled(sealed: dict[str, Any]) -> gym.vector.VectorEnv | None:
    """The environments of a sealed snapshot, or None with a notice: where this machine's key did
    not seal it (a colleague's run, a forged file), it is never unpickled, since unpickling
    could run code; where it does not unpickle (an environment's own ``__setstate__`` failing,
    a package changed since), the run goes on all the same."""
    data = unseal(sealed)
    if data is None:
        warnings.warn(
            "the run's environment snapshot was not written on this machine (it is not "
            f"sealed by the key in {key_path()}), so it is not loaded, since unpickling it "
            "could run code; the environments start new episodes",
            SnapshotNotice,
            stacklevel=3,
        )
        return None
    try:
        return pickle.loads(data)
    except Exception as e:  # the environments' own code, whatever it raises
        warnings.warn(
            f"the run's environment snapshot does not load ({type(e).__name__}: {e}); the "
            "environments start new episodes",
            SnapshotNotice,
            stacklevel=3,
        )
        return None


def simulate(
    envs: gym.vector.VectorEnv,
    algorithm: BatchedAlgorithm | Actor,
    steps: int,
    recorder: Recorder | None = None,
    seed: int | None = None,
) -> EnvironmentLoop:
    """TensorFlow Agents' ``simulate``: reset ``envs`` and step them ``steps`` times with
    ``algorithm``. Returns the loop, whose ``step()`` / ``run()`` continue where it stopped."""
    loop = EnvironmentLoop(envs, algorithm, recorder, seed)
    loop.run(steps)
    return loop
