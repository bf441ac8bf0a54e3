"""Agents, one folder each: config, networks, acting, learning, builder.

``BUILDERS`` maps the names that ``rlherd train AGENT`` accepts to each agent's builder.
"""

from rlherd.agents.bc import BCBuilder
from rlherd.agents.cql import CQLBuilder
from rlherd.agents.crr import CRRBuilder
from rlherd.agents.d4pg import D4PGBuilder, DDPGBuilder
from rlherd.agents.dqn import DQfDBuilder, DQNBuilder
from rlherd.agents.impala import ImpalaBuilder
from rlherd.agents.mcts import MCTSBuilder
from rlherd.agents.mpo import DMPOBuilder, MPOBuilder
from rlherd.agents.ppo import PPOBuilder
from rlherd.agents.r2d2 import R2D2Builder, R2D3Builder

BUILDERS = {
    "bc": BCBuilder,
    "cql": CQLBuilder,
    "crr": CRRBuilder,
    "d4pg": D4PGBuilder,
    "ddpg": DDPGBuilder,
    "dmpo": DMPOBuilder,
    "dqfd": DQfDBuilder,
    "dqn": DQNBuilder,
    "impala": ImpalaBuilder,
    "mcts": MCTSBuilder,
    "mpo": MPOBuilder,
    "ppo": PPOBuilder,
    "r2d2": R2D2Builder,
    "r2d3": R2D3Builder,
}
