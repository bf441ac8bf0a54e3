"""MPO's and DMPO's networks: a diagonal Gaussian policy and a scalar (MPO) or categorical (DMPO)
critic, from the building blocks of :mod:`rlherd.networks.continuous`."""

from __future__ import annotations

from rlherd.agents.mpo.config import MPOConfig
from rlherd.core import EnvSpec
from rlherd.networks.continuous import (
    ActorCritic,
    GaussianPolicy,
    ObsVector,
    make_critic,
    require_bounded_box,
)


def make_networks(spec: EnvSpec, config: MPOConfig, agent: str = "mpo") -> ActorCritic:
    require_bounded_box(spec, agent)
    c = config
    policy = GaussianPolicy(ObsVector(spec), spec.action_shape[0], tuple(c.policy_sizes),
                            c.policy_init_scale, c.policy_min_scale)  # fmt: skip
    return ActorCritic(spec, policy, make_critic(spec, c))
