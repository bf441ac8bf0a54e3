"""R2D2 (Kapturowski et al. 2019): a recurrent Q-network learned from prioritised sequences of
replay, with a burn-in that warms the stored recurrent state up before the loss, n-step double-Q
targets under the value rescaling h, and sequence priorities mixing their TD errors' max and
mean. R2D3 (Paine et al. 2019) is R2D2 with demonstrations mixed into its batches."""

from rlherd.agents.r2d2.builder import R2D2Builder, R2D3Builder
from rlherd.agents.r2d2.config import R2D2Config

__all__ = ["R2D2Builder", "R2D2Config", "R2D3Builder"]
