"""DQN's Q-network: a torso and a plain or dueling head (Wang et al. 2016)."""

from __future__ import annotations

import torch
from torch import nn

from rlherd.agents.dqn.config import DQNConfig
from rlherd.core import EnvSpec
from rlherd.networks import require_discrete, torso_of


class QNetwork(nn.Module):
    """``forward(obs [B, ...]) -> q [B, num_actions]``."""

    def __init__(self, spec: EnvSpec, config: DQNConfig):
        super().__init__()
        require_discrete(spec, "DQN")
        self.torso = torso_of(spec, config)
        self.dueling = config.dueling
        self.advantage = nn.Linear(self.torso.out_dim, spec.num_actions)
        self.value = nn.Linear(self.torso.out_dim, 1) if config.dueling else None
        # Environment steps of all actors so far (transitions inserted into replay), set by the
        # learner: it travels to actors with the parameters and drives their epsilon schedule,
        # so N actors explore as one would rather than decaying N times slower.
        self.register_buffer("experience", torch.zeros((), dtype=torch.int64))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.torso(obs)
        a = self.advantage(x)
        if self.value is None:
            return a
        return self.value(x) + a - a.mean(-1, keepdim=True)
