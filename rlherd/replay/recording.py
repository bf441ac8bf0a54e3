"""Recording played episodes as :class:`~rlherd.replay.offline.Episode` s, the unit of offline
datasets and demonstrations: :func:`record_episodes` plays a policy in one environment (``rlherd
collect``, scripted experts' demonstrations), and :class:`RecordingAlgorithm` keeps the episodes
a training run plays (the ``record_dataset`` setting of ``single``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from rich.progress import Progress

from rlherd.core import stack_obs
from rlherd.envs.wrappers import sample_action
from rlherd.replay.offline import Episode
from rlherd.types import map_obs

# Steps after which a played episode (an evaluation's, a recording's) is cut: Atari's 30 minutes
# of play at 60 frames per second (Machado et al. 2018). Environments without a limit of their own
# (MinAtar's) can go on forever under a good greedy policy, and an evaluation must end.
MAX_EPISODE_STEPS = 108_000


# (observation: an array or a dict of arrays, first call in its episode) -> action
Act = Callable[[Any, bool], Any]


def record_episodes(
    env: Any,
    act: Act | None,
    episodes: int,
    epsilon: float = 0.0,
    seed: int = 0,
    progress: bool = False,
    name: str = "",
) -> list[Episode]:
    """``episodes`` episodes of ``act`` in ``env`` (episode ``i`` reset with ``seed + i``), each
    truncated after ``MAX_EPISODE_STEPS`` as evaluations are. A uniformly random (legal) action
    replaces ``act``'s with probability ``epsilon``, and always when ``act`` is None."""
    env.action_space.seed(seed)
    rng = np.random.default_rng(seed)
    recorded = []
    with Progress(disable=not progress) as bar:
        task = bar.add_task(f"collect {name}", total=episodes)
        for i in range(episodes):
            obs, _ = env.reset(seed=seed + i)
            rows = EpisodeRows(obs)
            done, first = False, True
            while not done:
                if act is None or rng.random() < epsilon:
                    action = sample_action(env.action_space, obs)
                else:
                    action, first = act(obs, first), False
                obs, reward, terminated, truncated, _ = env.step(action)
                truncated = truncated or len(rows.action) + 1 >= MAX_EPISODE_STEPS
                rows.add(action, reward, obs, terminated, truncated)
                done = terminated or truncated
            recorded.append(rows.episode(env.action_space.dtype))
            bar.advance(task)
    return recorded


class EpisodeRows:
    """One episode's steps as they come, then as an :class:`Episode` (whose dict observations
    are a dict of stacked arrays, each keeping its dtype, as Minari stores a ``Dict`` space)."""

    def __init__(self, obs: Any):
        self.obs, self.action, self.reward, self.term, self.trunc = [obs], [], [], [], []

    def add(self, action, reward, next_obs, terminated, truncated) -> None:
        self.obs.append(next_obs)
        self.action.append(action)
        self.reward.append(reward)
        self.term.append(terminated)
        self.trunc.append(truncated)

    def episode(self, action_dtype: Any) -> Episode:
        return Episode(stack_obs(self.obs), np.stack(self.action).astype(action_dtype),
                       np.asarray(self.reward, np.float32), np.asarray(self.term, bool),
                       np.asarray(self.trunc, bool))  # fmt: skip

    def state_dict(self) -> dict[str, list]:
        return dict(vars(self))

    @classmethod
    def from_state(cls, state: dict[str, list]) -> EpisodeRows:
        rows = cls(state["obs"][0])
        vars(rows).update(state)
        return rows


class RecordingAlgorithm:
    """A :class:`~rlherd.core.BatchedAlgorithm` that hands everything on to ``algorithm`` and
    keeps every episode its environments finish, exploration and all: what a training run saw,
    which D4RL's medium-replay datasets are (the ``record_dataset`` setting of ``single``)."""

    def __init__(self, algorithm: Any):
        self.algorithm = algorithm
        self.actor = getattr(algorithm, "actor", algorithm)  # the loop binds environments to it
        self.open: dict[int, EpisodeRows] = {}  # environment -> its episode so far
        self.finished: list[Episode] = []

    def begin_episodes(self, indices: np.ndarray) -> None:
        """An environment that begins an episode drops what it held of an unfinished one (the
        fresh environments of a resumed run whose environments could not be checkpointed)."""
        self.algorithm.begin_episodes(indices)
        for i in np.asarray(indices).tolist():
            self.open.pop(i, None)

    def perform(self, obs: Any) -> np.ndarray:
        return self.algorithm.perform(obs)

    def experience(self, obs, action, reward, next_obs, terminated, truncated, skip) -> None:
        self.algorithm.experience(obs, action, reward, next_obs, terminated, truncated, skip)
        for i in np.flatnonzero(~np.asarray(skip)).tolist():
            rows = self.open.get(i)
            if rows is None:
                rows = self.open[i] = EpisodeRows(map_obs(lambda x, i=i: x[i], obs))
            rows.add(action[i], reward[i], map_obs(lambda x, i=i: x[i], next_obs),
                     terminated[i], truncated[i])  # fmt: skip
            if terminated[i] or truncated[i]:
                self.finished.append(self.open.pop(i).episode(np.asarray(action).dtype))

    def end_episodes(self, indices: np.ndarray) -> None:
        self.algorithm.end_episodes(indices)

    def state_dict(self) -> dict[str, Any]:
        """Plain data, as checkpoints hold (:mod:`rlherd.run.plain`)."""
        return dict(open={i: rows.state_dict() for i, rows in self.open.items()},
                    finished=[dataclasses.asdict(e) for e in self.finished])  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.open = {i: EpisodeRows.from_state(rows) for i, rows in state["open"].items()}
        self.finished = [Episode(**e) for e in state["finished"]]
