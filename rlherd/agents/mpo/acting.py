"""MPO and DMPO act by sampling their Gaussian policy (:class:`MPOPolicy`); evaluation acts with
its mean. Samples draw from the caller's generator, as D4PG's noise does."""

from __future__ import annotations

import torch

from rlherd import types as F
from rlherd.agents.acting import FeedForwardPolicy


class MPOPolicy(FeedForwardPolicy):
    """A :class:`~rlherd.core.Policy`: ``mean + std * N(0, 1)`` in the canonical box, clipped to
    it and rescaled to the environment's bounds; ``greedy`` (evaluation) acts with the mean."""

    @torch.no_grad()
    def __call__(self, obs, first, state, generator):
        mean, std = self.net.policy(obs.to(self.device))
        action = mean
        if not self.greedy:
            action = mean + std * torch.randn(mean.shape, generator=generator, device=self.device)
        return {F.ACTION: self.net.to_env(action)}, state
