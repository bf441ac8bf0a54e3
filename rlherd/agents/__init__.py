"""Agents, one folder each: config, networks, acting, learning, builder.

``BUILDERS`` maps the names that ``rlherd train AGENT`` accepts to each agent's builder. It is
made on first use from :data:`AGENTS`, the one table of agent names and where each builder
lives: reading the names (the CLI's ``--help`` does) imports no agent, and so no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

AGENTS: dict[str, str] = {
    "bc": "rlherd.agents.bc:BCBuilder",
    "cql": "rlherd.agents.cql:CQLBuilder",
    "crr": "rlherd.agents.crr:CRRBuilder",
    "d4pg": "rlherd.agents.d4pg:D4PGBuilder",
    "ddpg": "rlherd.agents.d4pg:DDPGBuilder",
    "dmpo": "rlherd.agents.mpo:DMPOBuilder",
    "dqfd": "rlherd.agents.dqn:DQfDBuilder",
    "dqn": "rlherd.agents.dqn:DQNBuilder",
    "impala": "rlherd.agents.impala:ImpalaBuilder",
    "mcts": "rlherd.agents.mcts:MCTSBuilder",
    "mpo": "rlherd.agents.mpo:MPOBuilder",
    "ppo": "rlherd.agents.ppo:PPOBuilder",
    "r2d2": "rlherd.agents.r2d2:R2D2Builder",
    "r2d3": "rlherd.agents.r2d2:R2D3Builder",
}

BUILDERS: dict[str, type]  # made by __getattr__ on first use, then an ordinary attribute


def __getattr__(name: str) -> Any:
    if name == "BUILDERS":
        builders = {}
        for agent, path in AGENTS.items():
            module, _, cls = path.partition(":")
            builders[agent] = getattr(importlib.import_module(module), cls)
        globals()["BUILDERS"] = builders
        return builders
    raise AttributeError(f"module 'rlherd.agents' has no attribute {name!r}")
