"""PPO's networks: an observation normaliser, policy and value MLPs (or one shared torso) whose
policy outputs the parameters of an action distribution from :mod:`rlherd.networks.distributions`
(categorical, multi-categorical or diagonal Gaussian), and the policy that acts with them."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import nn

from rlherd import types as F
from rlherd.agents.acting import FeedForwardPolicy, to_device
from rlherd.agents.ppo.config import PPOConfig
from rlherd.core import EnvSpec
from rlherd.networks import MLPTorso, make_torso, refuse_dict_options
from rlherd.networks.distributions import distribution_for, mask_logits
from rlherd.networks.encoders import MultiInputTorso
from rlherd.networks.normalization import RunningNorm

Obs = torch.Tensor | dict[str, torch.Tensor]  # [N, ...]: an array, or a dict of them


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
    """``forward(obs) -> (params [N, P], value [N])``.

    Observations are normalised inside by streaming statistics (``obs_norm``, when
    ``normalize_obs``), which the learner updates from every rollout it learns on. They are
    buffers of this module, so they travel with the parameters to every actor and into
    checkpoints, and evaluation sees observations exactly as training did.
    """

    def __init__(self, spec: EnvSpec, config: PPOConfig):
        super().__init__()
        self.spec = spec
        self.discrete = spec.action_kind != "continuous"
        self.dist, num_params = distribution_for(spec)
        action_dim = num_params if self.discrete else num_params // 2
        # Streaming normalisation suits a vector of numbers; images and dict observations (read
        # by the multi-input encoder: codes, one-hots, images) go to the network as they are.
        self.obs_norm = (
            RunningNorm(spec.obs_shape, clip=config.obs_clip)
            if config.normalize_obs and not (spec.is_image or spec.structured)
            else None
        )
        ortho = config.orthogonal_init
        self.shared = config.shared_network or spec.is_image
        self.policy_torso = self._torso(spec, config, config.hidden_sizes)
        self.value_torso = None
        if not self.shared:
            value_hidden = config.value_hidden_sizes or config.hidden_sizes
            self.value_torso = self._torso(spec, config, value_hidden)
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

    @staticmethod
    def _torso(spec: EnvSpec, config: PPOConfig, hidden: tuple[int, ...]) -> nn.Module:
        """An image torso, the multi-input encoder of a dict observation, or an MLP."""
        if spec.is_image:
            return make_torso(spec)
        if spec.structured:
            return MultiInputTorso(spec.obs, hidden, config.obs_encoders, config.obs_keys,
                                   config.activation)  # fmt: skip
        refuse_dict_options(spec, config.obs_keys, config.obs_encoders)
        return MLPTorso(spec.obs_shape, hidden, config.activation)

    def normalize(self, obs: Obs) -> Obs:
        if isinstance(obs, dict):
            return obs
        if self.obs_norm is None:
            return obs if obs.dtype == torch.uint8 else obs.float()
        return self.obs_norm(obs.float())

    def forward(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """An action mask in the observation masks the logits of discrete actions: sampling,
        log-probabilities, entropy and KL are then over the legal actions only."""
        x = self.normalize(obs)
        features = self.policy_torso(x)
        out = self.policy_head(features)
        if self.spec.has_action_mask:
            out = mask_logits(out, obs[F.ACTION_MASK])
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


class PPOPolicy(FeedForwardPolicy):
    """A :class:`~rlherd.core.Policy` over :class:`PPONet`: samples an action (the distribution's
    mode when ``greedy``) and returns what PPO's rollouts store."""

    @torch.no_grad()
    def __call__(self, obs, first, state, generator):
        params, value = self.net(to_device(obs, self.device))
        dist = self.net.dist
        action = dist.mode(params) if self.greedy else dist.sample(params, generator)
        outputs = {
            F.ACTION: action,
            F.BEHAVIOUR_LOG_PROB: dist.log_prob(params, action),
            F.POLICY_PARAMS: params,
            F.BASELINE: value,
        }
        return outputs, state
