"""CQL acts with the best action of its Q-network (discrete:
:class:`rlherd.agents.acting.CategoricalPolicy`) or with its tanh-Gaussian policy (continuous,
here)."""

from __future__ import annotations

import torch

from rlherd import types as F
from rlherd.agents.acting import FeedForwardPolicy, to_device


class TanhGaussianSamplingPolicy(FeedForwardPolicy):
    """A :class:`~rlherd.core.Policy`: ``tanh(mean + std * N(0, 1))`` from the caller's
    generator, rescaled to the environment's bounds; ``greedy`` (evaluation): ``tanh(mean)``."""

    @torch.no_grad()
    def __call__(self, obs, first, state, generator):
        mean, log_std = self.net.policy(to_device(obs, self.device))
        u = mean
        if not self.greedy:
            u = mean + log_std.exp() * torch.randn(mean.shape, generator=generator,
                                                   device=self.device)  # fmt: skip
        return {F.ACTION: self.net.to_env(torch.tanh(u))}, state
