"""Numpy reference implementations of the device environments (PettingZoo ``ParallelEnv``s)."""

from rlherd.envs.reference.tag import (
    TagContinuousConfig,
    TagContinuousReference,
    TagGridWorldConfig,
    TagGridWorldReference,
)

__all__ = [
    "TagContinuousConfig",
    "TagContinuousReference",
    "TagGridWorldConfig",
    "TagGridWorldReference",
]
