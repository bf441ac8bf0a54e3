"""D4PG's and DDPG's networks: a deterministic policy and a categorical (D4PG) or scalar (DDPG)
critic, from the building blocks of :mod:`rlherd.networks.continuous`."""

from __future__ import annotations

from rlherd.agents.d4pg.config import D4PGConfig
from rlherd.core import EnvSpec
from rlherd.networks.continuous import (
    ActorCritic,
    DeterministicPolicy,
    ObsVector,
    make_critic,
    require_bounded_box,
)


def make_networks(spec: EnvSpec, config: D4PGConfig, agent: str = "d4pg") -> ActorCritic:
    require_bounded_box(spec, agent)
    policy = DeterministicPolicy(ObsVector(spec), spec.action_shape[0], tuple(config.policy_sizes))
    return ActorCritic(spec, policy, make_critic(spec, config))
