"""IMPALA acts with :class:`ImpalaPolicy` through the on-policy :class:`RolloutActor`: one step
of the network on a batch of observations, a sampled action and what V-trace needs later (the
behaviour logits and the baseline)."""

from __future__ import annotations

import torch

from rlherd import types as F
from rlherd.agents.impala.networks import CoreState, ImpalaNet
from rlherd.networks.distributions import sample_categorical


class ImpalaPolicy:
    """A :class:`~rlherd.core.Policy` over :class:`ImpalaNet` (greedy: the most likely action)."""

    def __init__(self, net: ImpalaNet, greedy: bool = False):
        self.net, self.greedy = net, greedy
        self.device = next(net.parameters()).device

    def initial_state(self, batch_size: int) -> CoreState:
        return self.net.initial_state(batch_size)

    @torch.no_grad()
    def __call__(self, obs, first, state, generator):
        obs = F.map_obs(lambda x: x.to(self.device)[None], obs)
        outputs, state = self.net(obs, first.to(self.device)[None], state)
        logits = outputs[F.POLICY_LOGITS][0]
        action = logits.argmax(-1) if self.greedy else sample_categorical(logits, generator)
        baseline = outputs[F.BASELINE][0]
        return {F.ACTION: action, F.POLICY_LOGITS: logits, F.BASELINE: baseline}, state
