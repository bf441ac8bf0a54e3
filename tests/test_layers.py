"""Imports only point down the layers (docs/reference/index.md): errors, types, core and config at
the bottom, then losses, networks, envs, replay, run (the kit), agents, runtime, and the commands
and CLI on top. The test reads every module of ``rlherd/`` with :mod:`ast` (nothing is imported),
so an upward import is caught wherever it hides, a function-level import included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rlherd"

# Each unit of the layer map (a top-level module or package of rlherd) and its rank, bottom = 0.
# Units of one rank may import each other, but never in a cycle (checked below).
RANKS: dict[str, int] = {
    "errors": 0,
    "types": 0,
    "config": 0,
    "core": 0,
    "registry": 0,
    "losses": 1,
    "networks": 2,
    "envs": 3,
    "replay": 4,
    "run": 5,
    "agents": 6,
    "runtime": 7,
    "commands": 8,
    "cli": 8,
}
# ``rlherd/__init__.py`` is the public facade: it reaches every layer lazily, and no module of
# rlherd may import it back (it would be an import from the top floor).
FACADE = "rlherd"
FACADE_RANK = max(RANKS.values()) + 1


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(path: Path, tree: ast.Module) -> list[tuple[int, str]]:
    """Every ``rlherd`` module named by an import anywhere in the file, with its line. ``from
    rlherd import envs`` names ``rlherd.envs``; ``from rlherd import make`` names the facade;
    ``from rlherd.agents import d4pg`` names ``rlherd.agents`` and its submodule
    ``rlherd.agents.d4pg``."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base == FACADE:
                for alias in node.names:
                    is_unit = alias.name in RANKS
                    found.append((node.lineno, f"{FACADE}.{alias.name}" if is_unit else FACADE))
            else:
                found.append((node.lineno, base))
                found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names
                          if _is_module(f"{base}.{alias.name}")]  # fmt: skip
    return [(line, name) for line, name in found if name.split(".")[0] == FACADE]


def _is_module(name: str) -> bool:
    """Whether ``name`` (``rlherd.agents.d4pg``) is a module or package of rlherd's."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _unit(module: str) -> str:
    """``rlherd.run.loop`` -> ``run``; the facade itself -> ``rlherd``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else FACADE


def _rank(unit: str) -> int:
    return FACADE_RANK if unit == FACADE else RANKS[unit]


def _edges() -> list[tuple[str, int, str, str]]:
    """(file, line, importer's unit, imported unit) for every import between two units."""
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "__init__.py":
            continue  # the facade may import anything, lazily
        tree = ast.parse(path.read_text(), filename=str(path))
        here = _unit(_module_name(path))
        for line, name in _imported(path, tree):
            there = _unit(name)
            if there != here:
                edges.append((str(path.relative_to(PACKAGE.parent)), line, here, there))
    return edges


def test_every_unit_has_a_layer():
    """A new top-level module or package must be placed in the map before it can be checked."""
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    units = modules | packages
    assert units <= set(RANKS), f"place these in RANKS: {sorted(units - set(RANKS))}"


def test_imports_only_point_down():
    upward = [
        f"{file}:{line}: {here} (layer {_rank(here)}) imports {there} (layer {_rank(there)})"
        for file, line, here, there in _edges()
        if _rank(there) > _rank(here)
    ]
    assert not upward, "imports that point up the layers:\n" + "\n".join(upward)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [node])):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [])):
            return found
    return None


def test_no_import_cycle_between_units():
    """Units of one rank (errors, types, config and core; commands and cli) may import each
    other, but a cycle among units would make their order meaningless."""
    graph: dict[str, set[str]] = {}
    for _, _, here, there in _edges():
        graph.setdefault(here, set()).add(there)
    cycle = _cycle(graph)
    assert cycle is None, "import cycle between layers: " + " -> ".join(cycle)


@pytest.mark.parametrize(
    "graph, has_cycle",
    [
        ({"a": {"b"}, "b": {"a"}}, True),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, False),
        ({"a": {"b", "c"}, "b": {"c"}}, False),
    ],
)
def test_the_cycle_finder_finds_cycles(graph, has_cycle):
    """The cycle check is only as good as its finder."""
    assert (_cycle(graph) is not None) == has_cycle


# ------------------------------------------------------------------------------ agent folders
AGENTS = PACKAGE / "agents"


def _agent_folder(module: str) -> str | None:
    """The agent folder a module lives in (``rlherd.agents.d4pg.config`` -> ``d4pg``), or None
    for the modules agents share (``rlherd.agents.learning``) and everything outside agents."""
    parts = module.split(".")
    if parts[:2] != [FACADE, "agents"] or len(parts) < 3:
        return None
    return parts[2] if (AGENTS / parts[2] / "__init__.py").is_file() else None


def _cross_agent_imports(path: Path, tree: ast.Module) -> list[str]:
    here = _agent_folder(_module_name(path))
    return [f"{path.relative_to(PACKAGE.parent)}:{line}: {here} imports {name}"
            for line, name in _imported(path, tree)
            if here is not None and _agent_folder(name) not in (None, here)]  # fmt: skip


def test_no_agent_folder_imports_another():
    """What two agents share lives in a shared module (``rlherd/agents/*.py``, or a lower layer),
    so that an agent's folder can be read, changed or removed without reading another's."""
    found = []
    for path in sorted(AGENTS.glob("*/**/*.py")):
        found += _cross_agent_imports(path, ast.parse(path.read_text(), filename=str(path)))
    assert not found, "agent folders importing another agent's folder:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source, crosses",
    [
        ("from rlherd.agents.d4pg.config import PRESETS", True),
        ("from rlherd.agents import d4pg", True),
        ("import rlherd.agents.d4pg.networks", True),
        ("from ..d4pg import config", True),
        ("def f():\n    from rlherd.agents.d4pg import D4PGBuilder", True),
        ("from rlherd.agents.mpo.config import MPOConfig", False),
        ("from . import config", False),
        ("from rlherd.agents.learning import adam", False),
        ("from rlherd.agents import learning", False),
        ("from rlherd.networks.continuous import ActorCritic", False),
    ],
)
def test_the_agent_folder_check_sees_every_form_of_import(source, crosses):
    """As read from a module of MPO's folder."""
    path = AGENTS / "mpo" / "example.py"
    assert bool(_cross_agent_imports(path, ast.parse(source))) == crosses
