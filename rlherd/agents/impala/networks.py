"""IMPALA's network: a torso, an optional LSTM core, and policy / baseline heads."""

from __future__ import annotations

import torch
from torch import nn

from rlherd import types as F
from rlherd.agents.impala.config import ImpalaConfig
from rlherd.core import EnvSpec
from rlherd.networks import LSTMCore, autocast, require_discrete, torso_of
from rlherd.networks.distributions import mask_logits

CoreState = tuple[torch.Tensor, ...]
Obs = torch.Tensor | dict[str, torch.Tensor]  # [T, B, ...]: an array, or a dict of them


class ImpalaNet(nn.Module):
    """``forward(obs [T, B, ...], first [T, B], state) -> ({policy_logits, baseline}, state)``
    (a dict observation: a dict of ``[T, B, ...]`` tensors).

    ``first[t]`` marks rows that start an episode, where the LSTM state is zeroed; without an LSTM
    the state is an empty tuple and ``first`` is ignored.
    """

    def __init__(self, spec: EnvSpec, config: ImpalaConfig):
        super().__init__()
        require_discrete(spec, "IMPALA")
        self.torso = torso_of(spec, config)
        self.precision = config.precision
        self.core = LSTMCore(self.torso.out_dim, config.lstm_size) if config.use_lstm else None
        features = self.core.out_dim if self.core else self.torso.out_dim
        self.policy = nn.Linear(features, spec.num_actions)
        self.baseline = nn.Linear(features, 1)

    def initial_state(self, batch_size: int) -> CoreState:
        return self.core.initial_state(batch_size) if self.core else ()

    def forward(
        self, obs: Obs, first: torch.Tensor, state: CoreState = ()
    ) -> tuple[dict[str, torch.Tensor], CoreState]:
        """An action mask in the observation (``obs["action_mask"]``) masks the logits, so the
        policy, its log-probabilities and its entropy are over the legal actions only."""
        T, B = F.first_array(obs).shape[:2]
        rows = F.map_obs(lambda x: x.reshape(T * B, *x.shape[2:]), obs)
        # Learning passes only: acting one frame at a time is faster in float32 (casting the
        # weights costs more there than bfloat16 saves), and V-trace corrects for the gap.
        precision = self.precision if torch.is_grad_enabled() else "float32"
        with autocast(F.first_array(obs).device.type, precision):
            x = self.torso(rows)
        x = x.float()
        if self.core is not None:
            x, state = self.core(x.view(T, B, -1), first, state)
            x = x.reshape(T * B, -1)
        logits = mask_logits(self.policy(x), F.action_mask(rows))
        outputs = dict(policy_logits=logits.view(T, B, -1), baseline=self.baseline(x).view(T, B))
        return outputs, state
