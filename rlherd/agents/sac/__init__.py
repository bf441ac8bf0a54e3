"""SAC (Soft Actor-Critic, Haarnoja et al. 2018): a tanh-Gaussian policy that maximises the
smaller of two critics plus its own entropy, at a temperature tuned toward a target entropy;
Polyak-averaged target critics; n-step transitions from rate-limited replay, so the same agent
runs at one update per environment step or at high replay ratios. Its learner is CQL's for
continuous actions too."""

from rlherd.agents.sac.builder import SACBuilder
from rlherd.agents.sac.config import SACConfig
from rlherd.agents.soft_actor_critic import SACLearner

__all__ = ["SACBuilder", "SACConfig", "SACLearner"]
