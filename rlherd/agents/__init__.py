"""Agents, one folder each: config, networks, acting, learning, builder.

:data:`AGENTS` maps the names that ``rlherd train AGENT`` accepts to where each builder lives:
rlherd's own (:data:`OWN`) and those installed packages add through the ``rlherd.agents`` entry
point group (:mod:`rlherd.registry`). Reading the names (the CLI's ``--help`` does) imports no
agent, and so no torch. :data:`BUILDERS`, the builder classes themselves, is made on first use.
"""

from __future__ import annotations

from typing import Any

from rlherd import registry

OWN: dict[str, str] = {
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
    "sac": "rlherd.agents.sac:SACBuilder",
    "td3": "rlherd.agents.td3:TD3Builder",
}

AGENTS: dict[str, str]  # made by __getattr__ on first use, then ordinary attributes
BUILDERS: dict[str, type]


def __getattr__(name: str) -> Any:
    if name == "AGENTS":
        value: Any = registry.table(registry.AGENT_GROUP, OWN)
    elif name == "BUILDERS":
        own = {agent: registry.load(path) for agent, path in OWN.items()}
        agents = globals().get("AGENTS") or __getattr__("AGENTS")
        value = registry.load_each(agents, own, _not_a_builder)
    else:
        raise AttributeError(f"module 'rlherd.agents' has no attribute {name!r}")
    globals()[name] = value
    return value


def _not_a_builder(name: str, found: Any) -> str | None:
    from rlherd.agents.base import AgentBuilder

    if not (isinstance(found, type) and issubclass(found, AgentBuilder)):
        return f"it is not a subclass of rlherd.agents.base.AgentBuilder ({found!r})"
    if found.name != name:
        return f"the builder it holds is named {found.name!r}"
    return None
