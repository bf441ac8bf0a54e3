"""Naming environments: which ids rlherd can make, the module that registers each, and the id a
run records so that every process can make the same environment.

- A registered Gymnasium id (``CartPole-v1``), one of an optional family rlherd registers when
  it is installed (``ALE/...``, ``MinAtar/...``, ``dm_control/...``), or an OpenSpiel game
  (``open_spiel/<game>``, registered on first use), or a bsuite id (``bsuite/deep_sea/0``,
  made by :mod:`rlherd.envs.bsuite`).
- A bare id of one of :data:`PACKAGES` (``MiniGrid-*``, ``NetHack*``): its package is imported
  first, and the run records ``module:id``.
- ``module:Env-v0`` (Gymnasium's own form): ``module`` is imported, then the id made.
- ``module:function``: an environment factory, a function returning a ``gymnasium.Env``.

Gymnasium 1.x no longer imports installed packages by itself, so an id exists only in a process
that imported its package: the recorded ``module:...`` form is what lets actor processes,
environment servers, Ray nodes, ``rlherd eval`` and ``--resume`` make it too, and
:func:`child_env` hands child processes this one's import path for modules of the user's own.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym

from rlherd.envs import bsuite, openspiel
from rlherd.errors import ConfigError, MissingExtra


def register_optional_families() -> None:
    """Make the ids of installed optional families known to Gymnasium's registry."""
    try:
        import ale_py

        gym.register_envs(ale_py)
    except ImportError:
        pass
    if not any(k.startswith("MinAtar/") for k in gym.registry):
        try:
            from minatar.gym import register_envs

            register_envs()
        except ImportError:
            pass
    if not any(k.startswith("dm_control/") for k in gym.registry):
        try:
            with no_display_warning():
                import shimmy

                gym.register_envs(shimmy)
        except ImportError:
            pass


@contextlib.contextmanager
def no_display_warning() -> Iterator[None]:
    """dm_control imports glfw, which warns on a machine with no display (rendering still works
    with ``MUJOCO_GL=egl`` or ``osmesa``)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*DISPLAY environment variable")
        yield


# Multi-agent games, built as their numpy references (their device versions: rlherd.envs.device).
PETTINGZOO = "pettingzoo/"  # pettingzoo/<module>: a PettingZoo game (rlherd.envs.pettingzoo)
MULTI_AGENT = {"tag-gridworld": "TagGridWorldReference", "tag-continuous": "TagContinuousReference"}


# Gymnasium's MuJoCo tasks, by the name before the version (continuous-control presets).
MUJOCO_TASKS = (
    "halfcheetah", "hopper", "ant", "walker2d", "humanoid", "humanoidstandup", "swimmer",
    "reacher", "pusher", "invertedpendulum", "inverteddoublependulum",
)  # fmt: skip


# Packages whose environments register themselves when imported (Gymnasium 1.x no longer
# imports installed packages by itself): a bare id of theirs imports the package first, and a
# run records it as ``module:id`` so that every process imports it too.
PACKAGES: tuple[tuple[str, str, str], ...] = (
    # (id prefix, module that registers the ids, how to install it)
    ("MiniGrid-", "minigrid", "pip install 'rlherd[minigrid]'"),
    ("BabyAI-", "minigrid", "pip install 'rlherd[minigrid]'"),
    ("NetHack", "nle", "pip install 'rlherd[nethack]'"),
)

def split_id(env_id: str) -> tuple[str, str]:
    """``("module", "name")`` of ``module:name``; ``("", env_id)`` of a plain id."""
    module, sep, name = env_id.partition(":")
    return (module, name) if sep else ("", env_id)


def family(env_id: str) -> str:
    """The family of an id, which picks an agent's preset: atari, minatar, control (the DeepMind
    Control Suite), openspiel, pettingzoo (a PettingZoo game), toy, minigrid, nethack, bsuite,
    toytext (Gymnasium's toy text) or classic (anything else)."""
    module, name = split_id(env_id)
    if is_bsuite(env_id):
        return "bsuite"
    for prefix, kind in (("ALE/", "atari"), ("MinAtar/", "minatar"), ("rlherd/", "toy"),
                         ("dm_control/", "control"), ("open_spiel/", "openspiel"),
                         (PETTINGZOO, "pettingzoo")):  # fmt: skip
        if name.startswith(prefix):
            return kind
    if module == "minigrid" or name.startswith(("MiniGrid-", "BabyAI-")):
        return "minigrid"
    if module == "nle" or name.startswith("NetHack"):
        return "nethack"
    if name in gym.registry and "toy_text" in str(gym.spec(name).entry_point):
        return "toytext"
    return "classic"


def is_bsuite(env_id: str) -> bool:
    """A bsuite sweep id, ``bsuite/<experiment>/<n>`` (not Shimmy's ``bsuite/<experiment>-v0``)."""
    return env_id.startswith(bsuite.PREFIX) and env_id.count("/") == 2


def is_mujoco(env_id: str) -> bool:
    """A Gymnasium MuJoCo task (``HalfCheetah-v5``, ``Hopper-v5``, ...)."""
    return task_name(env_id) in MUJOCO_TASKS


def task_name(env_id: str) -> str:
    """An id's name before its version, lower case, without the module that registers it:
    ``gymnasium:HalfCheetah-v5`` -> ``halfcheetah`` (presets are chosen by it)."""
    return split_id(env_id)[1].split("-")[0].lower()


def known_ids() -> list[str]:
    register_optional_families()
    return sorted([*gym.registry, *MULTI_AGENT])


def _package(env_id: str) -> tuple[str, str] | None:
    """``(module, install hint)`` of a bare id of one of :data:`PACKAGES`."""
    for prefix, module, install in PACKAGES:
        if env_id.startswith(prefix):
            return module, install
    return None


def _import_for_suggestions(env_id: str) -> None:
    """Import the installed package of :data:`PACKAGES` whose prefix ``env_id`` has in another
    case (``Minigrid-Empty-5x5-v0``), so that its ids are among the close matches offered."""
    for prefix, module, _ in PACKAGES:
        if env_id.lower().startswith(prefix.lower()) and importlib.util.find_spec(module):
            with no_display_warning():
                importlib.import_module(module)


def _import(module: str, env_id: str, install: str | None = None) -> Any:
    """Import the module an id names; one that cannot be found is a :class:`MissingExtra`."""
    how = install or (
        f"install the package that provides {module!r} (a module of your own: put its folder "
        "on PYTHONPATH, e.g. PYTHONPATH=. rlherd train ...)"
    )
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a missing parent package of pkg.module
        found = None
    if found is None:
        raise MissingExtra(f"{env_id} needs the module {module!r}, which is not found: {how}")
    with no_display_warning():
        return importlib.import_module(module)


def _alike(a: str, b: str) -> bool:
    """Whether id ``a`` reads as a typo of ``b`` (a case or a character or two), rather than a
    name of its own that merely shares letters with it."""
    return difflib.SequenceMatcher(None, a.lower(), b.lower()).ratio() >= 0.8


def _pettingzoo_module(env_id: str) -> bool:
    """Whether ``env_id`` is the dotted path of a module holding a PettingZoo game
    (``mpe2.simple_spread_v3``, ``pettingzoo.classic.connect_four_v3``), given without the
    ``pettingzoo/`` that marks one. Imported to tell: the user named it to be trained."""
    if "." not in env_id or "/" in env_id or ":" in env_id:
        return False
    try:
        module = importlib.import_module(env_id)
    except Exception:  # no such module (or one that fails): no hint, the usual refusal
        return False
    # A parallel game's parallel_env(), or a turn-based one's env() beside its raw_env.
    return callable(getattr(module, "parallel_env", None)) or (
        callable(getattr(module, "env", None)) and hasattr(module, "raw_env"))


def check_id(env_id: str) -> None:
    if env_id in gym.registry:
        return
    if is_bsuite(env_id):  # made by rlherd.envs.bsuite, not Gymnasium's registry
        bsuite.bsuite_id(env_id)
        return
    if env_id.startswith(openspiel.PREFIX):  # any OpenSpiel game, registered on first use
        openspiel.register(env_id)
        return
    package = _package(env_id)
    if package is not None:
        _import(*package[:1], env_id, package[1])
    else:
        register_optional_families()
        _import_for_suggestions(env_id)
    if env_id in gym.registry:
        return
    if env_id.startswith(bsuite.PREFIX):  # near a sweep id: never Shimmy's, which log no CSV
        bsuite.bsuite_id(env_id)
    if _pettingzoo_module(env_id):
        raise ConfigError(f"unknown environment id {env_id!r}: it is the module of a PettingZoo "
                          f"game; train it as {PETTINGZOO}{env_id}")  # fmt: skip
    ids = known_ids()
    hint = ""
    for prefix, extra in (("ALE/", "atari"), ("MinAtar/", "minatar"), ("dm_control/", "control")):
        if env_id.startswith(prefix) and not any(i.startswith(prefix) for i in ids):
            hint = f" {prefix[:-1]} ids need the '{extra}' extra: pip install 'rlherd[{extra}]'."
    close = difflib.get_close_matches(env_id, ids, n=5, cutoff=0.6)
    if not close:  # match on the name alone, e.g. "Cartpole" -> "CartPole-v1"
        lower = {i.lower(): i for i in ids}
        close = [lower[c] for c in difflib.get_close_matches(env_id.lower(), list(lower), n=5)]
    did_you_mean = (
        f" Did you mean: {', '.join(close)}?"
        if close
        else " Known families: Gymnasium ids (CartPole-v1), ALE/<Game>-v5, MinAtar/<Game>-v1,"
        " dm_control/<domain>-<task>-v0, open_spiel/<game>, pettingzoo/<module>, MiniGrid-*,"
        " NetHack*, bsuite/<experiment>/<n>,"
        " rlherd/Bandit-v0, rlherd/Corridor-v0, rlherd/Reach-v0, rlherd/DeepSea-v0,"
        " rlherd/MaskedCartPole-v1; any other package's ids as module:Env-v0."
    )
    if close and ":" not in env_id and not any(_alike(env_id, c) for c in close):  # one's own?
        hint += f" An id your code registers: name the module that does, MODULE:{env_id}."
    raise ConfigError(f"unknown environment id {env_id!r}.{did_you_mean}{hint}")


FACTORY_MARK = "__rlherd_env_factory__"  # set by env_factory on what rlherd may call by path


def env_factory(factory: Callable[..., gym.Env]) -> Callable[..., gym.Env]:
    """Mark ``factory``, a function returning a ``gymnasium.Env`` from its keyword options, as
    one rlherd may call by its path, ``my_envs:make_env`` (a ``gymnasium.Env`` class needs no
    mark).

    Why a mark: a run records its environment by that path and its options, and loading the run
    (``rlherd eval``, ``--resume``, a shared package) calls what the path names with them. A
    run's record is a file anyone may write, and a path can name any function of any installed
    module (``os:system``); rlherd calls only those marked here. A Gymnasium registration
    (``gymnasium.register("MyEnv-v0", entry_point=...)``, trained as ``my_envs:MyEnv-v0``)
    needs no mark.

    Example::

        import gymnasium as gym
        import rlherd

        @rlherd.env_factory
        def make_env(size: int = 8) -> gym.Env:
            return gym.make("FrozenLake-v1", map_name=f"{size}x{size}", is_slippery=False)
    """
    setattr(factory, FACTORY_MARK, True)
    return factory


def is_env_factory(value: Any) -> bool:
    """Whether rlherd may call ``value`` by its path: a function marked by :func:`env_factory`,
    or a ``gymnasium.Env`` class (whose options build an environment, as a registered id's
    do)."""
    if isinstance(value, type):
        return issubclass(value, gym.Env)
    return callable(value) and getattr(value, FACTORY_MARK, False) is True


def target(env_id: str) -> tuple[str, Any]:
    """What ``module:name`` names once ``module`` is imported: ``("id", name)`` for an id it
    registered, ``("factory", function)`` for an environment factory of the module
    (:func:`is_env_factory`); any other function is refused."""
    module_name, name = split_id(env_id)
    if not module_name or not name:
        raise ConfigError(f"{env_id!r}: write module:Env-v0 or package.module:function")
    module = _import(module_name, env_id)
    if name in gym.registry:
        return "id", name
    factory = getattr(module, name, None)
    if is_env_factory(factory):
        return "factory", factory
    if callable(factory):
        raise ConfigError(
            f"{env_id!r} is not marked as an environment factory: put @rlherd.env_factory "
            f"above its definition in {module_name}. rlherd calls a function by its path only "
            "when marked, since a run's record could name any function (os:system)"
        )
    close = difflib.get_close_matches(name, list(gym.registry), n=5, cutoff=0.6)
    did_you_mean = f" Did you mean: {', '.join(close)}?" if close else ""
    raise ConfigError(
        f"{env_id!r}: importing {module_name} registered no environment {name!r}, and "
        f"{module_name} has no function of that name.{did_you_mean}"
    )


def resolve(env: str | Callable[..., gym.Env]) -> str:
    """The id a run records for ``env``, which every process (actor processes, environment
    servers, Ray nodes, ``rlherd eval``, ``--resume``) can make: a registered id as it is, a
    bare id of one of :data:`PACKAGES` as ``module:id``, and an environment factory (a function
    returning a ``gymnasium.Env``) as its import path ``package.module:function``.

    A factory must be a module-level function of an importable module: other processes import
    it by that path, so a lambda, a nested function or one defined in ``__main__`` is refused.

    >>> resolve("CartPole-v1")
    'CartPole-v1'
    """
    if isinstance(env, gym.Env):  # made here, it could not be made in a run's other processes
        made_as = f"its id, {env.spec.id!r}, or " if env.spec is not None else ""
        raise ConfigError(f"env is an environment object (a {type(env.unwrapped).__name__}); a "
                          "run makes its environments in every process it starts, so pass what "
                          f"makes it: {made_as}a module-level function that returns "
                          "it")  # fmt: skip
    if callable(env):
        module, name = getattr(env, "__module__", None), getattr(env, "__qualname__", "")
        if module in (None, "__main__") or not name.isidentifier():
            raise ConfigError(
                f"environment factory {env!r} cannot be imported by other processes: define it "
                "at the top level of a module (my_envs.py: def make_env(): ...) and pass that "
                "function, or its path 'my_envs:make_env'"
            )
        env = f"{module}:{name}"
    if not isinstance(env, str) or not env:
        raise ConfigError(f"env must be an id or an environment factory, not {env!r}")
    if env in MULTI_AGENT or env.startswith((openspiel.PREFIX, PETTINGZOO)):
        return env  # the module the id names is imported where the game is made
    if is_bsuite(env):
        bsuite.bsuite_id(env)
        return env
    if ":" in env:
        target(env)
        return env
    package = _package(env)
    if package is not None:
        check_id(env)
        return f"{package[0]}:{env}"
    check_id(env)
    module = _registering_module(env)
    return env if module is None else f"{module}:{env}"


# The packages whose ids every rlherd process has registered (register_optional_families).
REGISTERED_HERE = ("gymnasium", "ale_py", "minatar", "shimmy", "rlherd")


def _registering_module(env_id: str) -> str | None:
    """The module to record with a registered id that code of one's own registered: a process
    that did not run that code (an actor, ``rlherd eval``, ``--resume``) would not know the id.
    The candidate is the entry point's module, kept only if importing it alone registers the id
    (checked in a fresh process: an id registered elsewhere, or by the running script, is
    refused with the fix). None for the ids of the packages every process imports."""
    entry = gym.spec(env_id).entry_point
    while isinstance(entry, functools.partial):  # Shimmy registers the Control Suite's so
        entry = entry.func
    module = entry.partition(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", "")
    root = module.split(".")[0]
    if not module or root in REGISTERED_HERE and env_id in _ids_known(root not in BASE):
        return None
    check = ("import gymnasium, importlib, sys; importlib.import_module(sys.argv[1]); "
             "sys.exit(sys.argv[2] not in gymnasium.registry)")  # fmt: skip
    alone = module != "__main__" and root not in REGISTERED_HERE and subprocess.run(
        [sys.executable, "-P", "-c", check, module, env_id], capture_output=True, timeout=300,
        env={**os.environ, **child_env()}).returncode == 0  # fmt: skip
    if not alone:
        raise ConfigError(
            f"{env_id} is registered by code this process ran, not by importing {module} alone, "
            "so the run's other processes (actors, rlherd eval, --resume) would not know it: "
            f"train on 'MODULE:{env_id}', naming the module whose import registers it"
        )
    return module


BASE = ("gymnasium", "rlherd")  # of REGISTERED_HERE, those registered by importing rlherd.envs


@functools.cache
def _ids_known(families: bool) -> frozenset[str]:
    """The ids a fresh process knows once it has imported ``rlherd.envs`` (and, with
    ``families``, registered the optional families, which takes seconds): asked once per
    process, of a process that never ran one's own code. (An id that one's own module registers
    on gymnasium's ``CartPoleEnv`` has an entry point every process imports, but not the id.)"""
    register = "ids.register_optional_families(); " if families else ""
    code = (f"import json, gymnasium; from rlherd.envs import ids; {register}"
            "print(json.dumps(list(gymnasium.registry)))")  # fmt: skip
    try:
        out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                             timeout=300, env={**os.environ, **child_env()},
                             check=True)  # fmt: skip
        return frozenset(json.loads(out.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, ValueError, IndexError) as e:  # no answer to read
        said = getattr(e, "stderr", None) or ""
        said = said.decode(errors="replace") if isinstance(said, bytes) else said  # a timeout's
        raise RuntimeError(f"a fresh Python process ({sys.executable}) could not list the ids "
                           f"rlherd registers ({type(e).__name__}); it said: "
                           f"{said.strip()[-2000:] or 'nothing'}") from e


def check_recorded(env_id: str, run_dir: str | Path) -> None:
    """Refuse a run's recorded environment whose module is not installed, would be imported
    from inside the run directory itself, or is one no environment lives in (the standard
    library's, a program's ``__main__``): importing a module runs its code, and a run directory
    (shared, downloaded) must never run code of its own or choose what runs (``venv.__main__``
    made a virtualenv). ``python -m`` puts the working directory first on the import path, so a
    run's own ``evil.py`` would be found first, and a namespace package (``mujoco``) looks for
    its submodules there too: each part of the name is checked. A PettingZoo id,
    ``pettingzoo/<module>``, names its module too."""
    module, _ = split_id(env_id)
    if env_id.startswith(PETTINGZOO):
        module = env_id[len(PETTINGZOO):]
    if not module:
        return
    parts = module.split(".")
    if "__main__" in parts or parts[0] in sys.stdlib_module_names:
        raise ConfigError(f"this run's environment {env_id!r} names the module {module!r}, "
                          "where no environment lives (the standard library, or a program's "
                          "__main__); a run names the module of its environment")  # fmt: skip
    inside = Path(run_dir).resolve()
    for k in range(1, len(parts) + 1):
        try:
            found = importlib.util.find_spec(".".join(parts[:k]))
        except (ImportError, ValueError):  # a part that is no package: the import says so
            return
        if found is None and k == 1:
            raise MissingExtra(f"this run's environment {env_id!r} needs the module {module!r}, "
                               "which is not found here; install the package that provides "
                               "it")  # fmt: skip
        if found is None:
            return
        places = [found.origin, *(found.submodule_search_locations or [])]
        if any(p and Path(p).resolve().is_relative_to(inside) for p in places):
            raise ConfigError(
                f"this run's environment {env_id!r} would import {found.name!r} from inside the "
                f"run directory ({found.origin}); rlherd imports only installed modules for a "
                "run. Run from another directory, or install the package"
            )


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` while a child starts that reads them only then (a local
    Ray's processes, multiprocessing's fork server); as it was afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def child_env() -> dict[str, str]:
    """What a child process (an environment server, a local Ray worker) needs in its environment
    to import what this process imports, modules of the user's own included (a factory's module
    beside the script that started the run, a test's): this process's import path as its
    ``PYTHONPATH``."""
    paths = [os.path.abspath(p or os.curdir) for p in sys.path]
    return {"PYTHONPATH": os.pathsep.join(p for p in dict.fromkeys(paths) if os.path.isdir(p))}

