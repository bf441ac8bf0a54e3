"""MCTS's networks: Acme's policy-value network (a torso, then policy logits and a value) and,
for ``model=learned``, Acme's MLP transition model. Both travel to actors together."""

from __future__ import annotations

import math

import torch
from torch import nn

from rlherd.agents.mcts.config import MCTSConfig
from rlherd.agents.mcts.models import GAME_ROWS, cannot_train, in_game, learned_refusal
from rlherd.core import EnvSpec
from rlherd.errors import ConfigError
from rlherd.networks import require_discrete, torso_of


def mlp(sizes: tuple[int, ...]) -> nn.Sequential:
    """Linear layers of ``sizes`` with ReLUs between them (not after the last)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


class TransitionModel(nn.Module):
    """``(obs [B, ...], action [B]) -> (next obs [B, ...], reward [B], continuation logit [B])``:
    three MLPs on the flattened observation and the one-hot action (Acme's
    ``MLPTransitionModel``)."""

    def __init__(self, spec: EnvSpec, hidden_sizes: tuple[int, ...]):
        super().__init__()
        learned = learned_refusal(spec)
        if learned is not None and in_game(spec):  # a game's rows: no simulator either
            raise cannot_train(spec.env_id, GAME_ROWS, learned)
        if learned is not None:  # whether the simulator can copy it, only its environment says
            raise ConfigError(f"{learned}; search with the environment itself, where it can be "
                              f"copied: --set model=simulator (rlherd check-env {spec.env_id} "
                              "says whether MCTS can train it)")  # fmt: skip
        self.obs_shape, self.num_actions = spec.obs_shape, spec.num_actions
        flat = math.prod(spec.obs_shape)
        inputs = (flat + spec.num_actions, *hidden_sizes)
        self.next_obs = mlp((*inputs, flat))
        self.reward = mlp((*inputs, 1))
        self.continues = mlp((*inputs, 1))

    def forward(self, obs: torch.Tensor, action: torch.Tensor):
        one_hot = nn.functional.one_hot(action.long(), self.num_actions).float()
        x = torch.cat([obs.flatten(1).float(), one_hot], -1)
        next_obs = self.next_obs(x).reshape(-1, *self.obs_shape)
        return next_obs, self.reward(x).squeeze(-1), self.continues(x).squeeze(-1)


class MCTSNetworks(nn.Module):
    """``forward(obs) -> (logits [B, A], value [B])``; ``model`` is the transition model (None
    with the simulator)."""

    def __init__(self, spec: EnvSpec, config: MCTSConfig):
        super().__init__()
        require_discrete(spec, "MCTS")
        self.torso = torso_of(spec, config)
        self.logits = nn.Linear(self.torso.out_dim, spec.num_actions)
        self.value = nn.Linear(self.torso.out_dim, 1)
        self.model = None
        if config.model == "learned":
            self.model = TransitionModel(spec, tuple(config.model_hidden_sizes))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.torso(obs)
        return self.logits(x), self.value(x).squeeze(-1)
