"""Streaming observation normalisation, kept in a module's buffers so checkpoints carry it."""

from __future__ import annotations

import torch
from torch import nn


class RunningNorm(nn.Module):
    """Normalises inputs by the running mean and variance of everything passed to ``update``,
    then clips to ``[-clip, clip]`` (5 for observations in BatchPPO).

    Batches are merged with Chan et al.'s parallel formula, so the statistics equal numpy's mean
    and variance over the whole stream, whatever the batch sizes.
    """

    def __init__(self, shape: tuple[int, ...], clip: float = 5.0, eps: float = 1e-8):
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Add a batch ``[N, *shape]`` to the statistics."""
        x = x.to(torch.float64).reshape(-1, *self.mean.shape)
        n = x.shape[0]
        if n == 0:
            return
        batch_mean, batch_var = x.mean(0), x.var(0, unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.mean += delta * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = (x - self.mean) / torch.sqrt(self.var + self.eps)
        return normed.clamp(-self.clip, self.clip).to(
            x.dtype if x.is_floating_point() else torch.float32
        )
