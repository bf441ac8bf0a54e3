"""MCTS (the Acme paper, section 3.5): AlphaZero scaled down. A search guided by a policy prior
and a value network, over the environment itself or a learned model; the value learned by TD,
the policy by distilling the search. Two-player games search with values negated between
players (self-play)."""

from rlherd.agents.mcts.builder import MCTSBuilder
from rlherd.agents.mcts.config import MCTSConfig

__all__ = ["MCTSBuilder", "MCTSConfig"]
