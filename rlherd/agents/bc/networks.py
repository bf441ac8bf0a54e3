"""Behaviour cloning's policy: logits over discrete actions, or a Gaussian over continuous ones
in the canonical box ``[-1, 1]^D`` (rescaled from and to the environment's bounds)."""

from __future__ import annotations

from torch import nn

from rlherd.agents.bc.config import BCConfig
from rlherd.core import EnvSpec
from rlherd.errors import ConfigError
from rlherd.networks import require_discrete_or_box, torso_of
from rlherd.networks.continuous import (
    ActionBounds,
    GaussianPolicy,
    ObsVector,
    require_bounded_box,
)


class BCNetwork(ActionBounds, nn.Module):
    """``forward(obs)``: ``logits [B, A]`` (discrete actions) or ``(mean, std) [B, D]`` in the
    canonical box (continuous actions)."""

    def __init__(self, spec: EnvSpec, config: BCConfig):
        super().__init__()
        self.discrete = spec.action_kind == "discrete"
        if self.discrete:
            if config.loss == "mse":
                raise ConfigError("loss=mse is for continuous actions; use loss=logp")
            torso = torso_of(spec, config)
            self.policy = nn.Sequential(torso, nn.Linear(torso.out_dim, spec.num_actions))
            return
        require_discrete_or_box(spec, "bc")
        require_bounded_box(spec, "bc")
        if not config.hidden_sizes:  # the Gaussian heads read the last hidden layer's width
            raise ConfigError("hidden_sizes must name at least one hidden layer for continuous "
                              "actions, e.g. [256, 256]; got []")  # fmt: skip
        self.policy = GaussianPolicy(ObsVector(spec), spec.action_shape[0],
                                     tuple(config.hidden_sizes))  # fmt: skip
        self.register_bounds(spec)

    def forward(self, obs):
        return self.policy(obs)
