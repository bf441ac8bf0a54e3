"""bsuite's environments as rlherd makes them: Shimmy's Gymnasium binding, deep sea with its
optimal policy as a scripted expert, and bsuite's logging wrapper made picklable. (A module of
its own: it imports bsuite, which :mod:`rlherd.envs.bsuite` imports only when a bsuite id is
made.)"""

from __future__ import annotations

import copy
import copyreg
import functools
import inspect
from pathlib import Path
from typing import Any

import numpy as np
from bsuite.utils import wrappers
from numpy.random.bit_generator import ISeedSequence
from shimmy.bsuite_compatibility import BSuiteCompatibilityV0


class Logging(wrappers.Logging):
    """bsuite's :class:`~bsuite.utils.wrappers.Logging`, which a checkpoint can pickle with its
    rows and counters: bsuite's delegates unknown attributes to the environment it wraps, so
    unpickling one, which looks up ``__setstate__`` before that environment is set, recursed
    without end."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def _rebuilt(cls: type, state: dict[str, Any]) -> Any:
    """A bsuite wrapper from its attributes. bsuite's wrappers look every attribute they lack up
    in the environment they wrap, so pickle's and ``deepcopy``'s own way, which looks up
    ``__setstate__`` before that environment is set, recursed without end (as :class:`Logging`
    did): a checkpoint of a noise or scale experiment could not be loaded, nor could MCTS copy
    one. bsuite makes these wrappers itself, so they are registered with ``copyreg`` rather
    than subclassed."""
    wrapper = object.__new__(cls)
    wrapper.__dict__.update(state)
    return wrapper


def _reduced(wrapper: Any) -> tuple:
    return _rebuilt, (type(wrapper), vars(wrapper))


copyreg.pickle(wrappers.RewardNoise, _reduced)  # the *_noise experiments'
copyreg.pickle(wrappers.RewardScale, _reduced)  # the *_scale experiments'


class BSuite(BSuiteCompatibilityV0):
    """Shimmy's Gymnasium binding of a bsuite environment: its seed reaches every layer, and its
    copies do not log."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Shimmy seeds the environment and the innermost one's random generator; bsuite's
        reward-noise wrappers between them (``*_noise`` experiments) keep their own, which
        would draw from the operating system's entropy: they get the same generator."""
        obs, info = super().reset(seed=seed, options=options)
        if seed is not None:
            for layer in _layers(self._env):
                if "_rng" in vars(layer):
                    layer._rng = self.np_random
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
        searches with, one per node, and their imagined episodes must not reach bsuite's CSV.
        (Shimmy's binding hands unknown attributes to what it wraps, so without this method
        ``deepcopy`` found the logger's environment's, and returned a bare bsuite environment.)

        Only the bsuite environment is copied: the binding's spaces are shared (building them
        again was a third of a copy), and so is what :meth:`_unchanging` names. Random
        generators are shared until drawn from (:class:`_SharedUntilDrawn`): most of bsuite's
        environments draw only when an episode starts, which a search's copies never reach, and
        copying a generator's state was three quarters of a copy of catch. So the first copy
        also puts the environment's own generators in holders, which it draws through after."""
        inner = self._env._env if isinstance(self._env, Logging) else self._env
        layers = _layers(self._env)  # the logger's too: it holds Shimmy's ``np_random``
        memo.update({id(value): value for value in self._unchanging(layers[-1])})
        held: dict[int, _SharedUntilDrawn] = {}  # layers may hold one generator between them
        for layer in layers:
            for key, value in vars(layer).items():
                if isinstance(value, np.random.RandomState) and id(value) not in memo:
                    setattr(layer, key, held.setdefault(id(value), _SharedUntilDrawn(value)))
        new = object.__new__(type(self))
        new.__dict__.update(vars(self))  # spaces; gymnasium's unused _np_random (see np_random)
        new._env = copy.deepcopy(inner, memo)
        new._ezpickle_args = (new._env, *self._ezpickle_args[1:])  # pickled as the copy it is
        return new

    def _unchanging(self, env: Any) -> list[Any]:
        """What ``env`` (the bsuite environment, under its wrappers) holds that a step never
        changes, which copies share."""
        return []


def _layers(env: Any) -> list[Any]:
    """``env`` and what it wraps, outermost first: bsuite's wrappers (the logger's, the noise
    and scale experiments'), then the environment. Read from each one's attributes, as a
    wrapper's own lookup falls through to what it wraps."""
    layers = [env]
    while "_env" in vars(layers[-1]):
        layers.append(layers[-1]._env)
    return layers


class _Overwritten(ISeedSequence):
    """The seed of a generator whose state is set at once: blank words. Seeding a new one
    otherwise draws entropy from the OS and hashes it (``RandomState(0)`` then seeds it a second
    time), which cost more than copying the state: without it, searches of one tree on catch
    ran 1.32x as fast."""

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        return np.zeros(n_words, dtype)


def _copied(rng: np.random.RandomState) -> np.random.RandomState:
    """A generator of its own that draws what ``rng`` would draw next (its cached Gaussian too)."""
    state = rng.get_state(legacy=False)
    out = np.random.RandomState(getattr(np.random, state["bit_generator"])(_Overwritten()))
    out.set_state(state)
    return out


class _SharedUntilDrawn:
    """A random generator that an environment and its copies share until they draw: each takes
    a copy of its own (:func:`_copied`) before its first draw, so the shared one never moves and
    each draws what it would have drawn alone. An environment's generators are wrapped in it
    when the environment is first copied. It pickles as a plain generator of its own, even
    beside another holder of the same one."""

    __slots__ = ("_rng", "_shared")

    def __init__(self, rng: np.random.RandomState, shared: bool = False):
        self._rng, self._shared = rng, shared

    def __getattr__(self, name: str) -> Any:  # a draw, or any other use of the generator
        if self._shared:
            self._rng, self._shared = _copied(self._rng), False
        return getattr(self._rng, name)

    def __deepcopy__(self, memo: dict[int, Any]) -> _SharedUntilDrawn:
        self._shared = True
        return _SharedUntilDrawn(self._rng, shared=True)

    def __reduce__(self) -> Any:  # a checkpoint keeps plain generators, whatever holds them
        return _copied, (self._rng,)


def bind_start(env: Any) -> None:
    """Bind a bsuite cartpole's start to the environment as data (cartpole, cartpole swingup,
    and their noise and scale experiments). Their episodes start where a lambda bound to the
    environment draws (``_init_fn``): pickle refuses a lambda, so a checkpoint held no snapshot
    of the environment and a resumed run started its episodes from a fresh generator; and a copy
    kept its source's lambda, so a copy that started an episode drew from its source's
    generator. The same draw as a partial of the environment pickles, and copies with it."""
    cartpole = _layers(env)[-1]
    init_range = inspect.getclosurevars(cartpole._init_fn).nonlocals["init_range"]
    cartpole._init_fn = functools.partial(_start, cartpole, init_range)


def _start(cartpole: Any, init_range: float) -> float:
    """One of a cartpole's starting coordinates, as bsuite's ``_init_fn`` draws it."""
    return cartpole._rng.uniform(low=-init_range, high=init_range)


class MNIST(BSuite):
    """bsuite's MNIST bandits: copies share the training images and labels (47 MB, which a step
    only reads), where MCTS's search had copied them at every node."""

    def _unchanging(self, bandit: Any) -> list[Any]:
        return [bandit._images, bandit._labels]


class DeepSea(BSuite):
    """deep sea and deep sea stochastic, with their optimal policy as a scripted expert
    (``--demonstrations expert``, the Acme paper's demonstrations for DQfD and R2D3): always
    right, whichever action that is in the current cell (each cell draws its own mapping).

    ``--demonstrations expert`` alone takes the paper's demonstrations (section 4.8, and Acme's
    ``dqfd/bsuite_demonstrations.py``): one episode of deep sea; ``size * 10`` of the stochastic
    one, 80% of them successful (a positive return) and 20% not, as its windy moves and noisy
    rewards make them."""

    def _unchanging(self, sea: Any) -> list[Any]:
        """The action mapping and the generator that drew it, at construction. A deterministic
        sea draws from its generator when it moves right but never reads the draw (bsuite's
        ``rand() > 1 / size or deterministic``), so its copies share that one too: a search's
        copy of deep sea is then its few numbers."""
        unchanging = [sea._action_mapping, vars(sea).get("_mapping_rng")]
        return unchanging + [sea._rng] if sea._deterministic else unchanging

    def expert_demonstrations(self) -> tuple[int, float | None]:
        """How many expert episodes ``--demonstrations expert`` takes, and the share of them that
        must be successful (None: as they come)."""
        sea = getattr(self._env, "raw_env", self._env)
        return (1, None) if sea._deterministic else (sea._size * 10, 0.8)

    def expert_action(self) -> int:
        sea = getattr(self._env, "raw_env", self._env)  # under bsuite's logging wrapper, if any
        return int(sea._action_mapping[sea._row, sea._column])
