"""PPO (Schulman et al. 2017) and BatchPPO (TensorFlow Agents, Hafner et al. 2017)."""

from rlherd.agents.ppo.builder import PPOBuilder
from rlherd.agents.ppo.config import PPOConfig

__all__ = ["PPOBuilder", "PPOConfig"]
