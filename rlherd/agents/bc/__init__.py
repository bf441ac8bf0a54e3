"""Behaviour cloning (BC): a policy fitted to a dataset's actions by likelihood or squared
error, trained on the offline runtime (``rlherd train bc --env ENV --dataset ID``)."""

from rlherd.agents.bc.builder import BCBuilder
from rlherd.agents.bc.config import BCConfig

__all__ = ["BCBuilder", "BCConfig"]
