"""D4PG and DDPG act with a deterministic policy plus Gaussian noise (:class:`D4PGPolicy`); the
noise draws from the caller's generator, so a :class:`~rlherd.agents.acting.TransitionActor`
(or poly's batched inference) decides whose random stream exploration consumes."""

from __future__ import annotations

import torch

from rlherd import types as F
from rlherd.agents.acting import FeedForwardPolicy, to_device
from rlherd.networks.continuous import ActorCritic


class D4PGPolicy(FeedForwardPolicy):
    """A :class:`~rlherd.core.Policy`: ``pi(obs) + sigma * N(0, 1)`` in the canonical box, clipped
    to it and rescaled to the environment's bounds (Acme's ``ClippedGaussian`` then
    ``ClipToSpec``). ``greedy`` (evaluation) acts with ``pi(obs)`` alone."""

    def __init__(self, net: ActorCritic, sigma: float, greedy: bool = False):
        super().__init__(net, greedy)
        self.sigma = sigma

    @torch.no_grad()
    def __call__(self, obs, first, state, generator):
        action = self.net.policy(to_device(obs, self.device))
        if not self.greedy and self.sigma > 0:
            noise = torch.randn(action.shape, generator=generator, device=self.device)
            action = action + self.sigma * noise
        return {F.ACTION: self.net.to_env(action)}, state
