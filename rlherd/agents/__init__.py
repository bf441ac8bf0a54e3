"""Agents, one folder each: config, networks, acting, learning, builder.

``BUILDERS`` maps the names that ``rlherd train AGENT`` accepts to each agent's builder.
"""

from rlherd.agents.dqn import DQNBuilder
from rlherd.agents.impala import ImpalaBuilder
from rlherd.agents.ppo import PPOBuilder

BUILDERS = {"dqn": DQNBuilder, "impala": ImpalaBuilder, "ppo": PPOBuilder}
