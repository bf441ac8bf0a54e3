"""IMPALA with V-trace (Espeholt et al. 2018), as in TorchBeast."""

from rlherd.agents.impala.builder import ImpalaBuilder
from rlherd.agents.impala.config import ImpalaConfig

__all__ = ["ImpalaBuilder", "ImpalaConfig"]
