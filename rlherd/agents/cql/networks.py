"""CQL's networks: a Q-network over discrete actions, or SAC's actor-critic (a tanh-Gaussian
policy and twin critics, :class:`rlherd.networks.continuous.SACNetworks`) over continuous ones in
the canonical box."""

from __future__ import annotations

import torch
from torch import nn

from rlherd.agents.cql.config import CQLConfig
from rlherd.core import EnvSpec
from rlherd.networks import require_discrete_or_box, torso_of
from rlherd.networks.continuous import SACNetworks


class DiscreteQ(nn.Module):
    """``forward(obs [B, ...]) -> q [B, num_actions]``."""

    discrete = True

    def __init__(self, spec: EnvSpec, config: CQLConfig):
        super().__init__()
        torso = torso_of(spec, config)
        self.q = nn.Sequential(torso, nn.Linear(torso.out_dim, spec.num_actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(obs)


def make_networks(spec: EnvSpec, config: CQLConfig) -> DiscreteQ | SACNetworks:
    require_discrete_or_box(spec, "cql")
    if spec.action_kind == "discrete":
        return DiscreteQ(spec, config)
    return SACNetworks(spec, config, "cql")
