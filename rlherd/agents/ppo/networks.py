"""PPO's networks: an observation normaliser, policy and value MLPs (or one shared torso), and
the action distributions: categorical, multi-categorical and diagonal Gaussian.

Policies output a flat tensor of distribution parameters per row (``[N, P]``): the logits, or the
Gaussian mean followed by its log std. Rollouts store those parameters, so the learner can compute
``KL(behaviour || current)`` exactly for BatchPPO's penalty.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import nn

from rlherd.agents.ppo.config import PPOConfig
from rlherd.core import EnvSpec
from rlherd.networks import MLPTorso, make_torso
from rlherd.networks.normalization import RunningNorm


class Categorical:
    """Discrete actions; parameters are logits ``[N, A]``."""

    @staticmethod
    def log_prob(params: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(params, -1).gather(-1, action[..., None]).squeeze(-1)

    @staticmethod
    def entropy(params: torch.Tensor) -> torch.Tensor:
        log_p = torch.log_softmax(params, -1)
        return -(log_p.exp() * log_p).sum(-1)

    @staticmethod
    def kl(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        old_log_p, new_log_p = torch.log_softmax(old, -1), torch.log_softmax(new, -1)
        return (old_log_p.exp() * (old_log_p - new_log_p)).sum(-1)

    @staticmethod
    def sample(params: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.multinomial(torch.softmax(params, -1), 1, generator=generator).squeeze(-1)

    @staticmethod
    def mode(params: torch.Tensor) -> torch.Tensor:
        return params.argmax(-1)


class MultiCategorical:
    """Multi-discrete actions ``[N, H]``: one categorical per head; parameters are the heads'
    logits side by side ``[N, sum(nvec)]``. Heads are independent, so log probabilities,
    entropies and KLs add up."""

    def __init__(self, nvec: tuple[int, ...]):
        self.nvec = tuple(nvec)

    def split(self, params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return params.split(self.nvec, dim=-1)

    def log_prob(self, params: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        heads = self.split(params)
        return sum(Categorical.log_prob(h, action[..., k]) for k, h in enumerate(heads))

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return sum(Categorical.entropy(h) for h in self.split(params))

    def kl(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        pairs = zip(self.split(old), self.split(new), strict=True)
        return sum(Categorical.kl(a, b) for a, b in pairs)

    def sample(
        self, params: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        return torch.stack([Categorical.sample(h, generator) for h in self.split(params)], -1)

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return torch.stack([h.argmax(-1) for h in self.split(params)], -1)


class DiagGaussian:
    """Box actions; parameters are ``[N, 2 * D]``: the mean, then the log std."""

    @staticmethod
    def split(params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = params.chunk(2, dim=-1)
        return mean, log_std

    @classmethod
    def log_prob(cls, params: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        mean, log_std = cls.split(params)
        z = (action - mean) * torch.exp(-log_std)
        return (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    @classmethod
    def entropy(cls, params: torch.Tensor) -> torch.Tensor:
        _, log_std = cls.split(params)
        return (log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1)

    @classmethod
    def kl(cls, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        (m0, s0), (m1, s1) = cls.split(old), cls.split(new)
        var0, var1 = torch.exp(2 * s0), torch.exp(2 * s1)
        return (s1 - s0 + (var0 + (m0 - m1) ** 2) / (2 * var1) - 0.5).sum(-1)

    @classmethod
    def sample(cls, params: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        mean, log_std = cls.split(params)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device)
        return mean + log_std.exp() * noise

    @classmethod
    def mode(cls, params: torch.Tensor) -> torch.Tensor:
        return cls.split(params)[0]


def _init(layer: nn.Linear, gain: float, orthogonal: bool) -> nn.Linear:
    """CleanRL's orthogonal init with the given gain and zero bias; otherwise PyTorch's default
    init with the weights scaled by ``gain`` (BatchPPO's small initial action mean)."""
    if orthogonal:
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    else:
        with torch.no_grad():
            layer.weight.mul_(gain)
    return layer


class PPONet(nn.Module):
    """``forward(x) -> (params [N, P], value [N])`` on *normalised* observations ``x``.

    ``normalize(obs)`` applies the streaming observation statistics (updated by the actor, saved
    with the parameters, so evaluation sees observations exactly as training did).
    """

    def __init__(self, spec: EnvSpec, config: PPOConfig):
        super().__init__()
        self.spec = spec
        self.discrete = spec.action_kind != "continuous"
        if spec.action_kind == "discrete":
            self.dist, action_dim = Categorical, spec.num_actions
        elif spec.action_kind == "multidiscrete":
            self.dist, action_dim = MultiCategorical(spec.action_nvec), sum(spec.action_nvec)
        else:
            self.dist, action_dim = DiagGaussian, math.prod(spec.action_shape)
        self.obs_norm = (
            RunningNorm(spec.obs_shape, clip=config.obs_clip)
            if config.normalize_obs and not spec.is_image
            else None
        )
        ortho = config.orthogonal_init
        self.shared = config.shared_network or spec.is_image
        if spec.is_image:
            self.policy_torso = make_torso(spec)
        else:
            self.policy_torso = MLPTorso(spec.obs_shape, config.hidden_sizes, config.activation)
        self.value_torso = None
        if not self.shared:
            value_hidden = config.value_hidden_sizes or config.hidden_sizes
            self.value_torso = MLPTorso(spec.obs_shape, value_hidden, config.activation)
        if ortho:
            for m in self.modules():
                if isinstance(m, nn.Linear | nn.Conv2d):
                    _init(m, math.sqrt(2), True)
        value_features = (self.value_torso or self.policy_torso).out_dim
        self.policy_head = _init(
            nn.Linear(self.policy_torso.out_dim, action_dim), config.mean_init_scale, ortho
        )
        self.value_head = _init(nn.Linear(value_features, 1), 1.0, ortho)
        self.tanh_mean = config.tanh_mean and not self.discrete
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(config.init_log_std)))

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        if self.obs_norm is None:
            return obs if obs.dtype == torch.uint8 else obs.float()
        return self.obs_norm(obs.float())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.policy_torso(x)
        out = self.policy_head(features)
        if not self.discrete:
            mean = torch.tanh(out) if self.tanh_mean else out
            out = torch.cat([mean, self.log_std.expand_as(mean)], -1)
        value_features = features if self.value_torso is None else self.value_torso(x)
        return out, self.value_head(value_features).squeeze(-1)

    def policy_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters that only the policy loss trains (all of them when the torso is shared)."""
        if self.shared:
            yield from self.parameters()
            return
        yield from self.policy_torso.parameters()
        yield from self.policy_head.parameters()
        if not self.discrete:
            yield self.log_std

    def value_parameters(self) -> Iterator[nn.Parameter]:
        if self.shared:
            return
        yield from self.value_torso.parameters()
        yield from self.value_head.parameters()
