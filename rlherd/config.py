"""Resolving an agent's config from its defaults, a preset, a ``--config`` file and ``--set
key=value`` overrides."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import numbers
import stat
import sys
import types
import typing
from pathlib import Path
from typing import Any

from rlherd.errors import ConfigError

# The most rlherd reads of a run's JSON record (config.json, summary.json, evaluation.json): far
# more than it writes there, and little enough to hold in memory.
JSON_LIMIT = 4 * 2**20

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFSOCK: "a socket",
}


def run_file(path: Path, limit: int | None = None) -> Path:
    """``path``, checked before it is read: a regular file (where links lead) of at most
    ``limit`` bytes. Anything else is one line naming it, where reading it would block for ever
    (a FIFO), never end (a link to /dev/zero) or fail deep inside (a directory). Every reader of
    a run's files (and of a package's, a dataset's, a --config file's) opens them through
    this."""
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a file")
        raise ConfigError(f"{path} is {kind}, not a regular file; replace it with the file rlherd "
                          "wrote (from a copy of the run), or train the run again")  # fmt: skip
    if limit is not None and info.st_size > limit:
        raise ConfigError(f"{path} holds {info.st_size:,} bytes, more than the {limit:,} rlherd "
                          "reads from such a file: it is not one rlherd wrote; restore it from a "
                          "copy of the run, or train the run again")  # fmt: skip
    return path


SEED_BOUND = 2**32  # numpy's legacy seeding (np.random.seed, which a run calls) takes 0 to this - 1


def check_seed(seed: Any, what: str = "seed") -> int:
    """``seed`` as an int, or one line naming the range for a seed a run cannot be seeded with
    (rather than numpy's traceback once the run has started). Any integer type (numpy's too)."""
    whole = isinstance(seed, numbers.Integral) and not isinstance(seed, bool)
    if not (whole and 0 <= seed < SEED_BOUND):
        raise ConfigError(f"{what} must be a whole number from 0 to 2**32 - 1 (what numpy's "
                          f"seeding takes), got {seed!r}")  # fmt: skip
    return int(seed)


def parse_set(items: list[str]) -> dict[str, str]:
    """``["lr=1e-3", "use_lstm=true"]`` -> ``{"lr": "1e-3", "use_lstm": "true"}``."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"malformed --set {item!r}: write key=value, e.g. --set batch_size=32"
            )
        out[key.strip()] = value.strip()
    return out


def _coerce(name: str, text: str, hint: Any) -> Any:
    """Parse ``text`` as the field's type (str, int, float, bool, optional, tuple of ints, or a
    dict written as JSON)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if text.lower() in ("none", "null"):
            return None
        return _coerce(name, text, args[0])
    if hint is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}={text!r}: expected a boolean (true/false)")
    if hint is dict or origin is dict:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, dict):
            raise ConfigError(f'{name}={text!r}: expected a JSON object, e.g. {{"key": 1}}')
        return value
    if origin is tuple:
        (elem, *_) = typing.get_args(hint)
        parts = [p for p in text.strip("()[] ").replace(",", " ").split() if p]
        return tuple(_coerce(name, p, elem) for p in parts)
    try:
        return hint(text)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={text!r}: expected {getattr(hint, '__name__', hint)}") from None


def as_type(name: str, value: Any, hint: Any) -> Any:
    """A keyword (or JSON) value as the field's type: any whole number where an int goes (1e6
    too), any real where a float goes, a list where a tuple goes; any other type is one line
    naming the field, not an error from inside the network or the runtime that reads it."""
    np = sys.modules.get("numpy")  # not imported for it: `rlherd --help` stays quick
    if np is not None and isinstance(value, np.generic | np.ndarray):  # as Python's values
        value = value.tolist()
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None:
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    origin = typing.get_origin(hint)
    if origin is tuple and isinstance(value, (list, tuple)):
        return tuple(as_type(name, v, typing.get_args(hint)[0]) for v in value)
    if not isinstance(value, bool):
        if hint is int and (isinstance(value, numbers.Integral)
                            or isinstance(value, float) and value.is_integer()):  # fmt: skip
            return int(value)
        if hint is float and isinstance(value, numbers.Real):
            return float(value)
    if hint not in (int, float) and isinstance(value, origin or hint):
        return value
    if (origin or hint) is dict:
        raise ConfigError(f'{name}={value!r}: expected a dict, e.g. {{"key": 1}}')
    raise ConfigError(f"{name}={value!r}: expected {getattr(hint, '__name__', hint)}")


def apply_overrides(config: Any, overrides: dict[str, Any]) -> Any:
    """A copy of dataclass ``config`` with ``overrides`` (strings are parsed by field type)."""
    hints = typing.get_type_hints(type(config))
    fields = {f.name for f in dataclasses.fields(config)}
    values = {}
    for key, value in overrides.items():
        if key not in fields:
            close = difflib.get_close_matches(key, sorted(fields), n=3)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise ConfigError(
                f"unknown config key {key!r} for {type(config).__name__}.{hint} "
                f"Known keys: {', '.join(sorted(fields))}"
            )
        if isinstance(value, str) and hints[key] is not str:
            value = _coerce(key, value, hints[key])
        else:
            value = as_type(key, value, hints[key])
        if isinstance(value, float) and math.isnan(value):  # no field means anything by it
            raise ConfigError(f"{key}=nan: give {type(config).__name__}.{key} a number")
        layers = key.endswith("_sizes") and isinstance(value, tuple)  # a network's widths
        if layers and any(isinstance(v, int) and v < 1 for v in value):
            raise ConfigError(f"{key}={list(value)}: each layer needs at least 1 unit")
        values[key] = value
    try:
        return dataclasses.replace(config, **values)
    except ValueError as e:  # the config's own checks (__post_init__)
        raise ConfigError(f"{type(config).__name__}: {e}") from None


def to_json(config: Any) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(config)))


# What a --config file may hold, and of which type: the keys of a run's config.json (so a run's
# or a package's own config.json trains it again), of which ``machine`` (where that run ran)
# and ``package`` (what a package was made from) are ignored.
CONFIG_FILE_KEYS = dict(agent=str, env=str, runtime=str, seed=int, total_steps=int, preset=str,
                        env_kwargs=dict, eval_every=int, eval_episodes=int, config=dict,
                        settings=dict, machine=dict, package=dict)  # fmt: skip
IGNORED_KEYS = ("machine", "package")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A ``--config`` file (YAML, or JSON) as a dict of ``rlherd train``'s arguments: any of
    ``agent``, ``env``, ``runtime``, ``seed``, ``total_steps``, ``preset``, ``env_kwargs``,
    ``eval_every``, ``eval_episodes``, ``config`` (agent fields) and ``settings`` (runtime
    settings). Read as data only (``yaml.safe_load``): a file can name values, never code.

    Example (``ppo.yaml``)::

        agent: ppo
        env: CartPole-v1
        total_steps: 100000
        config: {learning_rate: 0.0003, num_epochs: 4}
        settings: {num_envs: 8}
    """
    import yaml

    path = Path(path)
    try:
        text = run_file(path, JSON_LIMIT).read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, json.JSONDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"--config {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path} must hold a mapping of {', '.join(CONFIG_FILE_KEYS)}")
    for key, value in data.items():
        kind = CONFIG_FILE_KEYS.get(key)
        if kind is None:
            close = difflib.get_close_matches(str(key), list(CONFIG_FILE_KEYS), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            known = [k for k in CONFIG_FILE_KEYS if k not in IGNORED_KEYS]
            raise ConfigError(f"--config {path}: unknown key {key!r}{hint}; it may hold "
                              f"{', '.join(known)}")  # fmt: skip
        if not isinstance(value, kind) or isinstance(value, bool):
            what = {int: "a whole number", str: "text", dict: "a mapping of names to values"}
            hint = " (YAML reads 1e5 as text: write 100000)" if kind is int else ""
            raise ConfigError(f"--config {path}: {key} must be {what[kind]}, got "
                              f"{value!r}{hint}")  # fmt: skip
    return {k: v for k, v in data.items() if k not in IGNORED_KEYS}
