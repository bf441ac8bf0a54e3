"""Where agents and runtimes are found: rlherd's own, and those of installed packages.

A package adds an agent or a runtime to rlherd without editing it, through Python entry points
in its ``pyproject.toml``::

    [project.entry-points."rlherd.agents"]
    myagent = "mypackage.agent:MyBuilder"          # an AgentBuilder subclass

    [project.entry-points."rlherd.runtimes"]
    myruntime = "mypackage.runtime:RUNTIME"        # a rlherd.runtime.Runtime

A table maps each name to its ``module:attribute`` path and nothing is imported until a name is
used, so listing the names (``rlherd train --help``) stays fast. rlherd's own names come first;
a package cannot replace one of them (one warning names it).
"""

from __future__ import annotations

import importlib
import warnings
from importlib import metadata
from typing import Any

AGENT_GROUP = "rlherd.agents"
RUNTIME_GROUP = "rlherd.runtimes"


def table(group: str, own: dict[str, str]) -> dict[str, str]:
    """``own`` names and paths, then those of the entry points of ``group`` of every installed
    distribution."""
    out = dict(own)
    for entry in metadata.entry_points(group=group):
        if entry.name in own:
            if entry.value != own[entry.name]:
                warnings.warn(f"{entry.value} ({group} entry point) is ignored: {entry.name!r} is "
                              "rlherd's own", stacklevel=2)  # fmt: skip
            continue
        out[entry.name] = entry.value
    return out


def load(path: str) -> Any:
    """The object at ``module:attribute``."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)
