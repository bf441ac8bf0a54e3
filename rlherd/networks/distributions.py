"""Action distributions over flat parameter tensors, and WarpDrive's sampler.

Policies output one flat tensor of distribution parameters per row (``[N, P]``): the logits, the
heads' logits side by side, or a Gaussian's mean followed by its log std. Rollouts store those
parameters, so a learner can compute ``KL(behaviour || current)`` exactly (BatchPPO's penalty).
Sampling inverts the CDF with one uniform number per row (WarpDrive's sampler): a softmax, a
cumulative sum and a count, with no host synchronisation, so it runs as well on a GPU as on a CPU.
"""

from __future__ import annotations

import math

import torch

from rlherd.core import EnvSpec

# What an illegal action's logit becomes: the lowest float32 (the lowest value of the logits'
# dtype). Its softmax probability is exactly 0, so log-probabilities, entropies and KLs computed
# from masked logits are those of the distribution over the legal actions alone; -inf would
# give 0 * -inf = nan in the entropy.
MASKED_LOGIT = torch.finfo(torch.float32).min


def mask_logits(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``logits [..., A]`` with the actions ``mask`` marks illegal (false or 0) set to the
    lowest value of their dtype (:data:`MASKED_LOGIT` for float32), which no gradient reaches;
    unchanged without a mask."""
    if mask is None:
        return logits
    return logits.masked_fill(~mask.bool(), torch.finfo(logits.dtype).min)


def sample_categorical(
    logits: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One action per row of ``logits [..., A]`` by inverting the CDF with one uniform number per
    row (WarpDrive's sampler): a softmax, a cumulative sum and a count, all on the device.

    An action of probability 0 (masked) is never drawn: the count takes the actions whose
    cumulative probability lies below ``u``, and ``u`` is never 0."""
    u = torch.rand(logits.shape[:-1] + (1,), generator=generator, device=logits.device)
    return categorical_from_uniform(logits, u)


def categorical_from_uniform(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The action :func:`sample_categorical` draws with the uniform number ``u [..., 1]`` in
    ``[0, 1)``. Apart so that a graph without a random generator of its own (``rlherd
    export --stochastic``) samples as rlherd does from noise it is given."""
    cdf = torch.softmax(logits, -1).cumsum(-1)
    u = u.clamp(min=torch.finfo(u.dtype).tiny) * cdf[..., -1:]  # never past the end
    return (cdf < u).sum(-1).clamp(max=logits.shape[-1] - 1)


def sample_multi_categorical(
    logits: list[torch.Tensor], generator: torch.Generator | None = None
) -> torch.Tensor:
    """Multi-discrete actions ``[..., len(logits)]``, one categorical per head."""
    return torch.stack([sample_categorical(head, generator) for head in logits], -1)


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
        return sample_categorical(params, generator)

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
        return sample_multi_categorical(list(self.split(params)), generator)

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
        mean, _ = cls.split(params)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device)
        return cls.from_normal(params, noise)

    @classmethod
    def from_normal(cls, params: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The action :meth:`sample` draws with standard normal ``noise [N, D]``."""
        mean, log_std = cls.split(params)
        return mean + log_std.exp() * noise

    @classmethod
    def mode(cls, params: torch.Tensor) -> torch.Tensor:
        return cls.split(params)[0]


def distribution_for(spec: EnvSpec):
    """The distribution of ``spec``'s actions and the number of parameters a policy outputs."""
    if spec.action_kind == "discrete":
        return Categorical, spec.num_actions
    if spec.action_kind == "multidiscrete":
        return MultiCategorical(spec.action_nvec), sum(spec.action_nvec)
    return DiagGaussian, 2 * math.prod(spec.action_shape)
