"""What every node of a distributed program is (:class:`Node`), and the counter node.

This module imports neither torch nor the agents: the counter's process, which only adds up the
actors' counts, starts in a fraction of a second instead of importing torch (2-3 s of a core)
while the other nodes start beside it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import ray


class Node:
    """A node's ``ready()`` says where it runs (the run's ``nodes.json``: its process, its
    machine's address, and Ray's id of its Ray node, which tells apart Ray nodes that share a
    machine), or raises what its constructor raised: Ray reports a constructor that raises only
    as a dead actor, which would hide a bad config behind "the node died"."""

    error: Exception | None = None

    def ready(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return dict(pid=os.getpid(), ip=ray.util.get_node_ip_address(),
                    node_id=ray.get_runtime_context().get_node_id())


def keeps_errors(init: Callable) -> Callable:
    """Decorates a node's ``__init__``: an exception is kept for ``ready()`` to raise."""

    @functools.wraps(init)
    def guarded(self: Node, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - raised again by ready()
            self.error = e

    return guarded


class CounterNode(Node):
    """Acme's counter: actor nodes add their steps and finished episodes; the driver takes what
    arrived since it last asked (its recorder keeps the run's totals)."""

    def __init__(self) -> None:
        self.steps, self.agent_steps, self.returns, self.lengths, self.policies = 0, 0, [], [], []
        self.per_actor: dict[int, int] = {}  # steps of each actor node since the run began

    def report(self, actor: int, steps: int, agent_steps: int,
               episodes: tuple[list, list, list | None]) -> None:  # fmt: skip
        returns, lengths, policies = episodes
        self.steps += steps
        self.agent_steps += agent_steps
        self.returns += returns
        self.lengths += lengths
        self.policies += policies or [None] * len(returns)
        self.per_actor[actor] = self.per_actor.get(actor, 0) + steps

    def take(self) -> tuple[int, int, tuple[list, list, list | None], dict[int, int]]:
        several = any(p is not None for p in self.policies)
        episodes = (self.returns, self.lengths, self.policies if several else None)
        out = (self.steps, self.agent_steps, episodes, dict(self.per_actor))
        self.steps, self.agent_steps, self.returns, self.lengths, self.policies = 0, 0, [], [], []
        return out
