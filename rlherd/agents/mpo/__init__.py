"""MPO (Abdolmaleki et al. 2018) and DMPO (MPO with a categorical critic): Gaussian policies
improved by weighted maximum likelihood under KL trust regions, from rate-limited replay."""

from rlherd.agents.mpo.builder import DMPOBuilder, MPOBuilder
from rlherd.agents.mpo.config import MPOConfig

__all__ = ["DMPOBuilder", "MPOBuilder", "MPOConfig"]
