"""TD3 (Twin Delayed DDPG, Fujimoto et al. 2018): DDPG with twin critics learned toward the
smaller target, target actions smoothed with clipped noise, and the policy and targets updated
every other critic update."""

from rlherd.agents.td3.builder import TD3Builder
from rlherd.agents.td3.config import TD3Config
from rlherd.agents.td3.learning import TD3Learner

__all__ = ["TD3Builder", "TD3Config", "TD3Learner"]
