"""bsuite's environments as rlherd makes them: Shimmy's Gymnasium binding, deep sea with its
optimal policy as a scripted expert, and bsuite's logging wrapper made picklable. (A module of
its own: it imports bsuite, which :mod:`rlherd.envs.bsuite` imports only when a bsuite id is
made.)"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from bsuite.utils import wrappers
from shimmy.bsuite_compatibility import BSuiteCompatibilityV0


class Logging(wrappers.Logging):
    """bsuite's :class:`~bsuite.utils.wrappers.Logging`, which a checkpoint can pickle with its
    rows and counters: bsuite's delegates unknown attributes to the environment it wraps, so
    unpickling one, which looks up ``__setstate__`` before that environment is set, recursed
    without end."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


class BSuite(BSuiteCompatibilityV0):
    """Shimmy's Gymnasium binding of a bsuite environment: its seed reaches every layer, and its
    copies do not log."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Shimmy seeds the environment and the innermost one's random generator; bsuite's
        reward-noise wrappers between them (``*_noise`` experiments) keep their own, which
        would draw from the operating system's entropy: they get the same generator."""
        obs, info = super().reset(seed=seed, options=options)
        if seed is not None:
            layer = self._env
            while layer is not None:
                if "_rng" in vars(layer):
                    layer._rng = self.np_random
                layer = vars(layer).get("_env")
        return obs, info

    def log_to(self, results_dir: Path) -> None:
        """Write bsuite's CSV into ``results_dir`` from now on (a resumed run's folder, where it
        is now)."""
        if isinstance(self._env, Logging):
            logger = self._env._logger
            logger._save_path = str(results_dir / Path(logger._save_path).name)

    def plain_progress(self) -> dict[str, Any] | None:
        """bsuite's counts so far as plain data: the logging wrapper's counters, the
        environment's own (those its ``bsuite_info`` reports, which bsuite scores) and the CSV's
        rows. A resumed run whose pickled environment cannot be loaded (sealed by another
        machine's key) hands them to a fresh one (:meth:`continue_from_progress`), so that
        bsuite's CSV goes on instead of starting again. None: this environment logs nothing."""
        if not isinstance(self._env, Logging):
            return None
        log = self._env
        return dict(steps=log._steps, episode=log._episode, total_return=log._total_return,
                    info=dict(log.bsuite_info()), rows=list(log._logger._data))  # fmt: skip

    def continue_from_progress(self, progress: dict[str, Any]) -> None:
        """Take up :meth:`plain_progress` in this fresh environment, which starts a new
        episode: the CSV goes on from the last episode that ended, with the counts it had then,
        and the steps and rewards of the episode cut short stay counted (a part of one)."""
        log = self._env
        log._steps, log._episode = progress["steps"], progress["episode"]
        log._total_return = progress["total_return"]
        raw = log.raw_env
        for key, value in progress["info"].items():  # bsuite keeps each as the attribute _<key>
            if not hasattr(raw, f"_{key}"):
                raise RuntimeError(f"bsuite's {type(raw).__name__} has no _{key} to continue")
            setattr(raw, f"_{key}", value)
        log._logger._data = list(progress["rows"])

    def __deepcopy__(self, memo: dict[int, Any]) -> BSuite:
        """A copy is the environment without bsuite's logger: copies are what MCTS's simulator
        searches with, and their imagined episodes must not reach bsuite's CSV. (Shimmy's
        binding hands unknown attributes to what it wraps, so without this method ``deepcopy``
        found the logger's environment's, and returned a bare bsuite environment.)"""
        inner = self._env._env if isinstance(self._env, Logging) else self._env
        return type(self)(copy.deepcopy(inner, memo))


class DeepSea(BSuite):
    """deep sea and deep sea stochastic, with their optimal policy as a scripted expert
    (``--demonstrations expert``, the Acme paper's demonstrations for DQfD and R2D3): always
    right, whichever action that is in the current cell (each cell draws its own mapping).

    ``--demonstrations expert`` alone takes the paper's demonstrations (section 4.8, and Acme's
    ``dqfd/bsuite_demonstrations.py``): one episode of deep sea; ``size * 10`` of the stochastic
    one, 80% of them successful (a positive return) and 20% not, as its windy moves and noisy
    rewards make them."""

    def expert_demonstrations(self) -> tuple[int, float | None]:
        """How many expert episodes ``--demonstrations expert`` takes, and the share of them that
        must be successful (None: as they come)."""
        sea = getattr(self._env, "raw_env", self._env)
        return (1, None) if sea._deterministic else (sea._size * 10, 0.8)

    def expert_action(self) -> int:
        sea = getattr(self._env, "raw_env", self._env)  # under bsuite's logging wrapper, if any
        return int(sea._action_mapping[sea._row, sea._column])
