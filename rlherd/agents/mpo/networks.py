"""MPO's and DMPO's networks: a diagonal Gaussian policy and a scalar (MPO) or categorical (DMPO)
critic, from the building blocks of :mod:`rlherd.networks.continuous`."""

from __future__ import annotations

from rlherd.agents.mpo.config import MPOConfig
from rlherd.core import EnvSpec
from rlherd.networks.continuous import (
    ActorCritic,
    Critic,
    GaussianPolicy,
    obs_dim,
    require_bounded_box,
)


def make_networks(spec: EnvSpec, config: MPOConfig, agent: str = "mpo") -> ActorCritic:
    """A derived support (no ``vmin`` / ``vmax``) starts at +-1; the learner places it at its
    first batch."""
    require_bounded_box(spec, agent)
    c = config
    in_dim, action_dim = obs_dim(spec), spec.action_shape[0]
    atoms = c.num_atoms if c.distributional else 1
    vmin, vmax = (c.vmin, c.vmax) if c.vmin is not None else (-1.0, 1.0)
    policy = GaussianPolicy(in_dim, action_dim, tuple(c.policy_sizes), c.policy_init_scale,
                            c.policy_min_scale)  # fmt: skip
    critic = Critic(in_dim, action_dim, tuple(c.critic_sizes), atoms, vmin, vmax)
    return ActorCritic(spec, policy, critic)
