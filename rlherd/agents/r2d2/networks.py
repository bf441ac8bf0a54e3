"""R2D2's recurrent Q-network: a torso, an LSTM, and a dueling head (Wang et al. 2016)."""

from __future__ import annotations

import torch
from torch import nn

from rlherd import types as F
from rlherd.agents.r2d2.config import R2D2Config
from rlherd.core import EnvSpec
from rlherd.networks import require_discrete, torso_of

State = tuple[torch.Tensor, torch.Tensor]  # the LSTM's (h, c), each [1, B, lstm_size]
Obs = torch.Tensor | dict[str, torch.Tensor]  # [T, B, ...]: an array, or a dict of them


class R2D2Network(nn.Module):
    """``unroll(obs [T, B, ...], state) -> (q [T, B, num_actions], state)``.

    An unroll never crosses an episode start: the actor zeroes the state where an episode
    begins, and replay sequences stay inside one episode (padded after its end), so the LSTM
    runs over the whole sequence in one call. Acme's Atari network also feeds the previous action
    and reward to the LSTM; this one reads observations only."""

    def __init__(self, spec: EnvSpec, config: R2D2Config):
        super().__init__()
        require_discrete(spec, "R2D2")
        self.torso = torso_of(spec, config)
        self.lstm = nn.LSTM(self.torso.out_dim, config.lstm_size)
        self.value = nn.Sequential(
            nn.Linear(config.lstm_size, config.head_size), nn.ReLU(),
            nn.Linear(config.head_size, 1),
        )  # fmt: skip
        self.advantage = nn.Sequential(
            nn.Linear(config.lstm_size, config.head_size), nn.ReLU(),
            nn.Linear(config.head_size, spec.num_actions),
        )  # fmt: skip

    def initial_state(self, batch_size: int) -> State:
        shape = (1, batch_size, self.lstm.hidden_size)
        device = self.lstm.weight_ih_l0.device
        return torch.zeros(shape, device=device), torch.zeros(shape, device=device)

    def unroll(self, obs: Obs, state: State) -> tuple[torch.Tensor, State]:
        T, B = F.first_array(obs).shape[:2]
        x = self.torso(F.map_obs(lambda v: v.flatten(0, 1), obs)).view(T, B, -1)
        out, state = self.lstm(x, state)
        a = self.advantage(out)
        return self.value(out) + a - a.mean(-1, keepdim=True), state
