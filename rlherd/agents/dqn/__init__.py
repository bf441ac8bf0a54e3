"""DQN (Mnih et al. 2015) with double Q-learning, n-step returns, dueling heads and prioritised
replay: the replay-based agent that exercises Acme's seams end to end."""

from rlherd.agents.dqn.builder import DQfDBuilder, DQNBuilder
from rlherd.agents.dqn.config import DQNConfig

__all__ = ["DQNBuilder", "DQNConfig", "DQfDBuilder"]
