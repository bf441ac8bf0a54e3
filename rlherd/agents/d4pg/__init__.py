"""D4PG (Barth-Maron et al. 2018) and DDPG (Lillicrap et al. 2016): deterministic policies with
Gaussian exploration, target networks and n-step transitions from rate-limited replay; D4PG's
critic is categorical."""

from rlherd.agents.d4pg.builder import D4PGBuilder, DDPGBuilder
from rlherd.agents.d4pg.config import D4PGConfig

__all__ = ["D4PGBuilder", "DDPGBuilder", "D4PGConfig"]
