"""Where agents and runtimes are found: rlherd's own, and those of installed packages.

A package adds an agent or a runtime to rlherd without editing it, through Python entry points
in its ``pyproject.toml``::

    [project.entry-points."rlherd.agents"]
    myagent = "mypackage.agent:MyBuilder"          # an AgentBuilder subclass

    [project.entry-points."rlherd.runtimes"]
    myruntime = "mypackage.runtime:RUNTIME"        # a rlherd.runtime.Runtime

A table maps each name to its ``module:attribute`` path. Agents are imported when a run uses
them; a package's runtimes are imported when rlherd starts (the command line makes a flag of
each of their settings), so a runtime's module should import its heavy stacks where it runs.
rlherd's own names come first, and a package cannot replace one of them. An entry that fails to
import, or is not what its group holds, is left out with one warning: a broken package never
breaks rlherd.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from importlib import metadata
from typing import Any

from rlherd.errors import Notice

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
                              "rlherd's own", Notice, stacklevel=2)  # fmt: skip
            continue
        out[entry.name] = entry.value
    return out


def load(path: str) -> Any:
    """The object at ``module:attribute``."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


class RegistryNotice(Notice):
    """An installed package's agent or runtime is left out (it fails to load, or is not one)."""


def load_each(paths: dict[str, str], own: dict[str, Any],
              problem: Callable[[str, Any], str | None]) -> dict[str, Any]:  # fmt: skip
    """``own`` objects, and the object at each other path of ``paths`` unless loading it fails or
    ``problem(name, object)`` names what is wrong with it (then one :class:`RegistryNotice`)."""
    out = {}
    for name, path in paths.items():
        if name in own:
            out[name] = own[name]
            continue
        try:
            found = load(path)
            wrong = problem(name, found)
        except Exception as e:  # anything an outside package's import raises
            wrong = f"{type(e).__name__}: {e}"
        if wrong:
            warnings.warn(f"{path} (entry point {name!r}) is left out: {wrong}", RegistryNotice,
                          stacklevel=2)  # fmt: skip
            continue
        out[name] = found
    return out
