"""``rlherd collect``: record a policy's episodes as an offline dataset (Minari's format).

The policy is a run's latest (its evaluation policy: greedy, or the mean action) or, with no
run, a uniformly random one. ``epsilon`` replaces each action, with that probability, by a
uniformly random one; D4RL's datasets are made this way from policies of chosen quality (see the
docs/guides/offline-and-demonstrations.md for the recipe).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlherd import envs as rl_envs
from rlherd.commands.evaluate import load_policy
from rlherd.errors import ConfigError
from rlherd.replay.offline import check_free, write_dataset
from rlherd.replay.recording import Act, record_episodes
from rlherd.types import batch_of_one


def collect(
    run_dir: str | Path | None,
    out: str,
    episodes: int,
    *,
    env: str | None = None,
    env_kwargs: dict[str, Any] | None = None,
    epsilon: float = 0.0,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Record ``episodes`` episodes of ``run_dir``'s policy (or of a random policy on ``env``
    when ``run_dir`` is None) as the Minari dataset ``out``; what was recorded, as a dict."""
    if episodes < 1:
        raise ConfigError(f"episodes must be >= 1, got {episodes}")
    if not 0.0 <= epsilon <= 1.0:
        raise ConfigError(f"epsilon must be in [0, 1], got {epsilon}")
    check_free(out)  # before any episode is played
    act = None
    env = None if env is None else rl_envs.resolve(env)  # as a run records it
    if run_dir is not None:
        trained = load_policy(run_dir, seed=seed)  # refuses runs a policy alone cannot play
        record = trained.record
        if env is not None and env != record.env:
            raise ConfigError(f"{run_dir} was trained on {record.env}; drop --env {env}")
        env, env_kwargs = record.env, record.env_kwargs
        act = actor_policy(trained.make_actor())
    elif env is None:
        raise ConfigError("name a run to record its policy, or --env ENV for a random policy")
    env_kwargs = env_kwargs or {}
    environment = rl_envs.make(env, **env_kwargs)
    recorded = record_episodes(environment, act, episodes, epsilon, seed, progress, out)
    policy = f"run {run_dir}" if run_dir is not None else "random"
    about = dict(env=env, env_kwargs=env_kwargs, policy=policy, epsilon=epsilon, seed=seed)
    write_dataset(out, recorded, environment.observation_space, environment.action_space, about)
    environment.close()
    returns = np.array([e.rewards.sum() for e in recorded])
    return dict(dataset=out, episodes=episodes, steps=int(sum(len(e) for e in recorded)),
                return_mean=float(returns.mean()), return_std=float(returns.std()),
                return_min=float(returns.min()), return_max=float(returns.max()),
                **about)  # fmt: skip


def actor_policy(actor: Any) -> Act:
    """An :class:`~rlherd.core.Actor` acting in one environment, as an :data:`Act`."""

    def act(obs: Any, first: bool) -> Any:
        if first:
            actor.observe_first(batch_of_one(obs), np.ones(1, dtype=bool))
        return actor.select_action(batch_of_one(obs))[0]

    return act
