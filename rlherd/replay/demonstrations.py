"""Demonstrations mixed into a replay agent's batches at a fixed ratio (DQfD, R2D3).

A run with ``--demonstrations SOURCE --demonstration-ratio r`` keeps a second table beside its
replay, made by the agent's own builder and filled through its own adder (so demonstrations are
the same items the agent samples from replay: n-step transitions for DQN, burn-in sequences for
R2D2), and every batch takes ``round(r * batch_size)`` items from it and the rest from replay,
as Acme's DQfD and R2D3 mix their datasets. ``SOURCE`` is:

- a Minari dataset id (``rlherd eval RUN --record-episodes N --out ID`` or ``rlherd collect``
  records one from a trained policy; ``minari download`` fetches published ones);
- ``expert`` or ``expert:N``: N episodes of the environment's scripted expert, for
  environments that have one (``rlherd/DeepSea-v0``'s optimal policy; ``rlherd/Corridor-v0``;
  bsuite's deep sea ids). Without N: the environment's own recipe where it has one (bsuite's
  deep sea: the Acme paper's, 1 episode, or ``size * 10`` of the stochastic one with 80%
  successful), else 10.

Demonstration items never get new priorities (their keys are -1 in the batch) and weigh 1 in
the importance-weighted loss; ``data["demonstration"]`` marks them for losses that treat them
apart (DQfD's large-margin loss).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlherd.core import EnvSpec
from rlherd.errors import ConfigError, NeedsInput
from rlherd.replay import offline
from rlherd.replay.dataset import ReplayDataset, ReplaySample
from rlherd.replay.table import SampleBatch, Table

EXPERT = "expert"
EXPERT_EPISODES = 10


def demonstration_count(batch_size: int, ratio: float) -> int:
    """Demonstrations per batch: ``round(ratio * batch_size)``, at least one and at most all
    but one (a ratio of 0 or 1 is refused earlier)."""
    return min(max(1, round(ratio * batch_size)), batch_size - 1)


def expert_episodes(env_id: str, env_kwargs: dict[str, Any], episodes: int | None,
                    seed: int) -> list[offline.Episode]:  # fmt: skip
    """``episodes`` episodes of ``env_id``'s scripted expert: the ``expert_action()`` of its
    unwrapped environment. Left out, they are as many as its ``expert_demonstrations()`` says
    (bsuite's deep sea: the Acme paper's), with the share of successful ones it gives, or
    :data:`EXPERT_EPISODES`."""
    from rlherd import envs as rl_envs

    env = rl_envs.make(env_id, **env_kwargs)
    expert = getattr(env.unwrapped, "expert_action", None)
    if expert is None:
        env.close()
        raise _no_expert(env_id)
    share = None
    if episodes is None:
        recipe = getattr(env.unwrapped, "expert_demonstrations", lambda: (EXPERT_EPISODES, None))
        episodes, share = recipe()
    try:
        return _recorded(env, lambda obs, first: expert(), episodes, share, seed)
    finally:
        env.close()


def check_source(source: str, env_id: str, env_kwargs: dict[str, Any]) -> None:
    """Refuse, before a run starts, ``expert`` demonstrations of an environment that has no
    scripted expert (the default of dqfd and r2d3): its user must name recorded ones."""
    from rlherd import envs as rl_envs

    if source.partition(":")[0] != EXPERT:
        return
    if rl_envs.family(env_id) == "pettingzoo":  # (the Tag games are refused before, by spec)
        raise ConfigError(f"{env_id} is a multi-agent game, and demonstrations (dqfd, r2d3) are "
                          "of one single-agent environment: train dqn or r2d2, the same learners "
                          "without them")  # fmt: skip
    env = rl_envs.make(env_id, **env_kwargs)
    try:
        if getattr(env.unwrapped, "expert_action", None) is None:
            raise _no_expert(env_id)
    finally:
        env.close()


def _no_expert(env_id: str) -> NeedsInput:
    return NeedsInput(
        f"{env_id} has no scripted expert (--demonstrations expert); record demonstrations "
        "from a trained run with `rlherd eval RUN --record-episodes N --out ID` and pass "
        "--demonstrations ID", "--demonstrations ID")


def _recorded(env: Any, act: Callable, episodes: int, share: float | None,
              seed: int) -> list[offline.Episode]:  # fmt: skip
    """``episodes`` episodes of ``act``; with ``share``, that share of them (rounded) with a
    positive return and the rest without, drawn until both counts are filled."""
    from rlherd.replay.recording import record_episodes

    if share is None:
        return record_episodes(env, act, episodes, seed=seed)
    wanted = {True: round(share * episodes), False: episodes - round(share * episodes)}
    kept: list[offline.Episode] = []
    for attempt in range(1000 * episodes):
        if not any(wanted.values()):
            return kept
        episode = record_episodes(env, act, 1, seed=seed + attempt)[0]
        success = float(np.sum(episode.rewards)) > 0
        if wanted[success]:
            wanted[success] -= 1
            kept.append(episode)
    raise ConfigError(f"the expert's episodes were not {share:.0%} successful within "
                      f"{1000 * episodes} tries")  # fmt: skip


def load(source: str, spec: EnvSpec, env_id: str, env_kwargs: dict[str, Any],
         seed: int) -> list[offline.Episode]:  # fmt: skip
    """The episodes ``source`` names (see the module docstring)."""
    name, _, count = source.partition(":")
    if name == EXPERT:
        try:
            episodes = int(count) if count else None
        except ValueError:
            raise ConfigError(f"--demonstrations {source!r}: write expert:N, N a number") from None
        if episodes is not None and episodes < 1:
            raise ConfigError(f"--demonstrations {source!r}: N must be >= 1")
        return expert_episodes(env_id, env_kwargs, episodes, seed)
    dataset = offline.load_dataset(source)
    offline.check_matches(dataset, spec, env_id, env_kwargs)
    return list(offline.episodes(dataset))


def make_table(builder: Any, spec: EnvSpec, episodes: list[offline.Episode]) -> Table:
    """The agent's own table, sized for ``episodes``, filled through its own adder. An agent
    that stores more with each step than an episode records (MCTS's search policy) is
    refused."""
    extras = builder.extras_signature(spec) if hasattr(builder, "extras_signature") else {}
    if extras:
        raise ConfigError(
            f"{builder.name} stores {', '.join(extras)} with every step, which demonstrations do "
            "not record; it cannot mix them in (drop --demonstrations)"
        )
    steps = sum(len(e) for e in episodes)
    table = builder.make_replay_tables(spec, insert_blocking=False, dataset_size=steps)[0]
    table.name = "demonstrations"
    offline.fill(builder.make_adder([table], 1), episodes)
    return table


class MixedDataset:
    """Batches of ``replay``'s items and ``demonstrations``' at a fixed ratio (two of a
    builder's datasets, whose batch sizes this sets: ``batch_size - k`` and ``k``). The learner
    sees one dataset: ``importance_beta`` goes to the replay part, ``ready()`` and ``close()``
    to both."""

    def __init__(self, replay: ReplayDataset, demonstrations: ReplayDataset, ratio: float):
        k = demonstration_count(replay.batch_size, ratio)
        replay.batch_size, demonstrations.batch_size = replay.batch_size - k, k
        self.replay, self.demonstrations = replay, demonstrations

    @property
    def importance_beta(self) -> float | Callable[[], float] | None:
        return self.replay.importance_beta

    @importance_beta.setter
    def importance_beta(self, beta: float | Callable[[], float] | None) -> None:
        self.replay.importance_beta = beta

    def ready(self) -> bool:
        return self.replay.ready() and self.demonstrations.ready()

    def __iter__(self) -> MixedDataset:
        return self

    def __next__(self) -> ReplaySample:
        ours, theirs = next(self.replay), next(self.demonstrations)
        data = {k: torch.cat([v, theirs.data[k]]) for k, v in ours.data.items()}
        n, k = len(ours.info.keys), len(theirs.info.keys)
        flags = torch.cat([torch.zeros(n, dtype=torch.bool), torch.ones(k, dtype=torch.bool)])
        data["demonstration"] = flags.to(self.replay.device)
        a, b = ours.info, theirs.info
        info = SampleBatch({}, np.concatenate([a.keys, np.full(k, -1, dtype=np.int64)]),
                           *(np.concatenate([getattr(a, f), getattr(b, f)])
                             for f in ("probabilities", "table_size", "priorities",
                                       "times_sampled")))  # fmt: skip
        weights = ours.weights
        if weights is not None:
            weights = torch.cat([weights, torch.ones(k, device=weights.device)])
        return ReplaySample(data, info, weights)

    def close(self) -> None:
        self.replay.close()
        self.demonstrations.close()
