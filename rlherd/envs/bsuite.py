"""The Behaviour Suite (Osband et al. 2020) through the ``bsuite`` package: ids
``bsuite/<experiment>/<n>`` (``bsuite/deep_sea/0``, ``bsuite/memory_len/3``), each one of
bsuite's own sweep settings, made as Shimmy's Gymnasium binding of bsuite's environment.

bsuite scores an agent from its *training* episodes, logged by bsuite's own CSV logger, which
counts episodes per environment instance and writes one CSV per id. So a run's training
environment is given ``results_dir`` (``rlherd train`` sets it to the run's ``bsuite/``
folder), and only that one: evaluation environments log nothing. The logger keeps its rows and
counters in the environment, so a checkpoint's snapshot of the environment (the single
runtime's) carries them, and a resumed run continues the same CSV.

Each id has bsuite's episode budget (:func:`episode_budget`); bsuite's analysis reads the
episodes up to it.
"""

from __future__ import annotations

import difflib
from typing import Any

import gymnasium as gym

from rlherd.errors import ConfigError, MissingExtra

PREFIX = "bsuite/"
INSTALL = "pip install 'rlherd[bsuite]'"
RESULTS = "bsuite"  # a run directory's folder of bsuite's CSV (its training environment's)
# make_bsuite's options that only the run sets (its RESULTS folder), never a user or a record.
RUN_OPTIONS = frozenset({"results_dir", "overwrite"})
# A bsuite run ends at bsuite's episode budget; its step budget is only a bound that no id's
# budget reaches (the longest, cartpole_swingup's, is a million steps).
STEP_BOUND = 10_000_000


def _bsuite() -> Any:
    try:
        import bsuite
        from bsuite import sweep  # noqa: F401  (bsuite.sweep: the ids)
    except ImportError as e:
        raise MissingExtra(f"bsuite ids need the bsuite package: {INSTALL}") from e
    return bsuite


def bsuite_id(env_id: str) -> str:
    """``deep_sea/0`` of ``bsuite/deep_sea/0``, checked against bsuite's sweep."""
    name = env_id[len(PREFIX):]
    ids = _bsuite().sweep.SWEEP
    if name not in ids:
        experiment = name.rstrip("/")
        members = [i for i in ids if i.startswith(f"{experiment}/")]
        close = members[:1] or difflib.get_close_matches(name, ids, n=5, cutoff=0.6)
        hint = f" Did you mean: {', '.join(PREFIX + c for c in close)}?" if close else ""
        if members:  # an experiment's name alone
            hint += f" (its ids: {PREFIX}{experiment}/0 to /{len(members) - 1})"
        raise ConfigError(
            f"unknown bsuite id {env_id!r}.{hint} bsuite ids are bsuite/<experiment>/<n>, the "
            f"experiments: {', '.join(experiment_names())} (bsuite.sweep.SWEEP lists every id)"
        )
    return name


def experiment_names() -> list[str]:
    """bsuite's experiment names (``deep_sea``, ``memory_len``, ...), sorted."""
    return sorted({i.split("/")[0] for i in _bsuite().sweep.SWEEP})


def ids(experiments: list[str] | None = None) -> list[str]:
    """Every ``bsuite/...`` id, or those of ``experiments``, in bsuite's sweep order."""
    sweep = _bsuite().sweep.SWEEP
    known = experiment_names()
    for name in experiments or []:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise ConfigError(
                f"unknown bsuite experiment {name!r}.{hint} Known: {', '.join(known)}"
            )
    return [PREFIX + i for i in sweep if not experiments or i.split("/")[0] in experiments]


def _load(name: str) -> Any:
    """bsuite's environment of the sweep id ``name`` (``load_from_id`` without its printout)."""
    from urllib.error import URLError

    bsuite = _bsuite()
    try:
        return bsuite.load(name.split("/")[0], bsuite.sweep.SETTINGS[name])
    except URLError as e:  # the mnist experiments' first use downloads MNIST
        raise ConfigError(
            f"bsuite/{name} needs MNIST, which bsuite downloads into /tmp/mnist on first use, "
            f"and the download failed ({e.reason}); put MNIST's four .gz files there (from "
            "https://storage.googleapis.com/cvdf-datasets/mnist/) and run again"
        ) from e


def episode_budget(env_id: str) -> int:
    """The number of episodes bsuite runs ``env_id`` for: its experiment's ``NUM_EPISODES``,
    which bsuite gives its environments as ``bsuite_num_episodes`` (read without making one,
    which for mnist's would load MNIST)."""
    import importlib

    experiment = bsuite_id(env_id).split("/")[0]
    return int(importlib.import_module(f"bsuite.experiments.{experiment}.sweep").NUM_EPISODES)


def make_bsuite(env_id: str, results_dir: str | None = None, overwrite: bool = False,
                **kwargs: Any) -> gym.Env:  # fmt: skip
    """The Gymnasium environment of ``env_id``; with ``results_dir``, one that logs its episodes
    there in bsuite's CSV format, refusing a CSV already there unless ``overwrite`` (a second
    writer of the same id would corrupt bsuite's counts; a resumed run's environment, restored
    from its checkpoint, rewrites its CSV with the rows it had)."""
    if kwargs:
        raise ConfigError(
            f"{env_id} takes no options (bsuite fixes each id's settings), got {sorted(kwargs)}"
        )
    from rlherd.envs.ids import no_display_warning

    with no_display_warning():  # importing shimmy imports dm_control, which imports glfw
        from rlherd.envs.bsuite_env import MNIST, BSuite, DeepSea, Logging, bind_start

    name = bsuite_id(env_id)
    experiment = name.split("/")[0]
    env = _load(name)
    if experiment.startswith("cartpole"):
        bind_start(env)
    if results_dir is not None:
        from bsuite.logging import csv_logging

        try:
            logger = csv_logging.Logger(name, results_dir, overwrite)
        except ValueError as e:  # the CSV exists
            raise ConfigError(f"{e}: each bsuite id's CSV is written by one run") from e
        env = Logging(env, logger)
    return (DeepSea if experiment.startswith("deep_sea")
            else MNIST if experiment.startswith("mnist") else BSuite)(env)  # fmt: skip
