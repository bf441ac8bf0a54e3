"""CQL (Conservative Q-Learning, Kumar et al. 2020): Q-learning that pushes down the values of
actions a dataset does not take; over a Q-network for discrete actions or a SAC-style
actor-critic for continuous ones; offline only (``rlherd train cql --env ENV --dataset ID``)."""

from rlherd.agents.cql.builder import CQLBuilder
from rlherd.agents.cql.config import CQLConfig

__all__ = ["CQLBuilder", "CQLConfig"]
