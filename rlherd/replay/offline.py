"""Offline datasets in Minari's format (the Acme paper's offline RL, sections 2.6 and 3.7).

A dataset is a Minari dataset: episodes of ``observations`` (``T + 1`` rows: the last is the
final observation), ``actions``, ``rewards``, ``terminations`` and ``truncations`` (``T`` rows),
kept by id (``cartpole/expert-v0``) under Minari's root: ``$MINARI_DATASETS_PATH``, else
``~/.minari/datasets``. Datasets from elsewhere (``minari download D4RL/...``) read the same way.

A dict observation (:mod:`rlherd.envs.wrappers`) is stored as Minari stores a ``Dict`` space: a
group of arrays, one per key, each in its own dtype. Reading gives observations as
:func:`rlherd.envs.make` gives them, whoever wrote the dataset (:func:`read_observations`).

rlherd writes them with :func:`write_dataset` (``rlherd collect``) and reads them into an agent's
replay tables through the agent's own adder (:func:`fill`), so an offline learner samples the
same items (n-step transitions, sequences) that it samples online, from the same table code.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from rlherd.config import JSON_LIMIT, run_file
from rlherd.core import EnvSpec, Leaf, flatten_space, flatten_value
from rlherd.errors import ConfigError
from rlherd.types import map_obs

ABOUT_KEY = "rlherd"  # metadata: the env id, env kwargs and policy a dataset was recorded with

# An episode's observations: one array, or a dict of named arrays, of T + 1 rows each.
Observations = np.ndarray | dict[str, np.ndarray]


@dataclass
class Episode:
    """One recorded episode (``T`` steps)."""

    observations: Observations  # [T + 1, ...]: the last row is the episode's final observation
    actions: np.ndarray  # [T, ...]
    rewards: np.ndarray  # [T] float
    terminations: np.ndarray  # [T] bool
    truncations: np.ndarray  # [T] bool

    def __len__(self) -> int:
        return len(self.rewards)


def _minari():
    try:
        import minari
    except ImportError:
        raise ConfigError(
            "offline datasets are Minari datasets: pip install 'rlherd[offline]'"
        ) from None
    return minari


def write_dataset(
    dataset_id: str,
    episodes: list[Episode],
    observation_space: gym.Space,
    action_space: gym.Space,
    about: dict[str, Any],
) -> Any:
    """Write ``episodes`` as the Minari dataset ``dataset_id`` and return it. Arrays are stored
    as they are (no JPEG encoding of images), so reading back gives exactly what was recorded.
    ``about`` (the env id and kwargs, the policy) goes into the metadata under ``rlherd``."""
    minari = _minari()
    from minari.data_collector.episode_buffer import EpisodeBuffer

    buffers = [
        EpisodeBuffer(id=i, observations=e.observations, actions=e.actions,
                      rewards=list(e.rewards), terminations=list(e.terminations),
                      truncations=list(e.truncations), infos={})  # fmt: skip
        for i, e in enumerate(episodes)
    ]
    try:
        with warnings.catch_warnings():  # Minari's advice on authors and permalinks
            warnings.filterwarnings("ignore", category=UserWarning, module="minari")
            dataset = minari.create_dataset_from_buffers(
                dataset_id, buffers, observation_space=observation_space,
                action_space=action_space, algorithm_name=about.get("policy"),
                description=json.dumps(about), jpeg_encoding=False,
            )  # fmt: skip
    except ValueError as e:  # a malformed id, or one that is taken
        raise ConfigError(
            f"cannot write dataset {dataset_id!r}: {e} (ids look like name-v0 or "
            "namespace/name-v0; `minari delete ID` removes a dataset)"
        ) from None
    dataset.storage.update_metadata({ABOUT_KEY: json.dumps(about)})
    return dataset


def check_free(dataset_id: str) -> None:
    """Refuse, before a run records anything, an id that is malformed or taken."""
    _minari()  # a clear error without the extra
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.storage.datasets_root_dir import get_dataset_path

    try:
        parse_dataset_id(dataset_id)
    except (ValueError, TypeError):  # Minari's TypeError: an id without a version
        raise ConfigError(f"malformed dataset id {dataset_id!r}: ids look like name-v0 or "
                          "namespace/name-v0") from None
    if get_dataset_path(dataset_id).exists():
        raise ConfigError(f"dataset {dataset_id!r} exists; choose another id, or remove it with "
                          f"`minari delete {dataset_id}`")  # fmt: skip


def load_dataset(dataset_id: str) -> Any:
    """The local Minari dataset ``dataset_id`` (a :class:`minari.MinariDataset`), with its
    first episode read, so that a missing or damaged one is one line before anything runs."""
    minari = _minari()
    with _readable(dataset_id):
        _check_metadata(dataset_id)
        dataset = minari.load_dataset(dataset_id)
        next(iter(dataset.iterate_episodes()), None)  # reads main_data.hdf5
        return dataset


def _check_metadata(dataset_id: str) -> None:
    """What Minari takes on trust from a dataset's metadata.json, checked before Minari reads
    it: an object, whose spaces Gymnasium makes, whose episode count its data files can hold
    (Minari allocates an index per episode: 10^15 of them asked for petabytes) and whose
    ``rlherd`` entry is a JSON object. A fault raises ``ValueError``, which :func:`_readable`
    words as a damaged dataset."""
    from minari.serialization import deserialize_space
    from minari.storage.datasets_root_dir import get_dataset_path

    data = get_dataset_path(dataset_id) / "data"
    if not (data / "metadata.json").exists():
        return  # Minari says what is missing
    meta = json.loads(run_file(data / "metadata.json", JSON_LIMIT).read_bytes())
    if not isinstance(meta, dict):
        raise ValueError(f"its metadata.json holds a JSON {type(meta).__name__}, not an object")
    for key in ("observation_space", "action_space"):
        try:
            if key in meta:  # else Minari makes it from the environment's spec
                deserialize_space(meta[key])
        except (TypeError, ValueError, KeyError, AssertionError, NotImplementedError) as e:
            raise ValueError(f"its {key} is not a space Gymnasium makes ({e!r:.100})") from None
    size = sum(p.stat().st_size for p in data.iterdir() if p.is_file())
    count = meta.get("total_episodes", 0)
    if type(count) is not int or not 0 <= count <= size:
        raise ValueError(f"its metadata counts {str(count)[:20]} episodes, more than its {size:,} "
                         "bytes of data can hold")  # fmt: skip
    about = meta.get(ABOUT_KEY, "{}")
    if not isinstance(about, str) or not isinstance(json.loads(about or "null"), dict):
        raise ValueError(f"its metadata's {ABOUT_KEY!r} is {str(about)[:60]!r}, not the JSON "
                         "object rlherd records")  # fmt: skip


@contextlib.contextmanager
def _readable(dataset_id: str) -> Iterator[None]:
    """Turn what Minari and h5py raise on a missing or damaged dataset into one line."""
    from minari.storage.datasets_root_dir import get_dataset_path

    try:
        yield
    except (OSError, ValueError, KeyError) as e:  # h5py's OSError, JSON's ValueError, ...
        try:
            where = get_dataset_path(dataset_id)
        except ValueError:  # not an id at all
            where = None
        if where is None or not (where / "data").is_dir():
            raise ConfigError(
                f"no dataset {dataset_id!r} under {get_dataset_path()} ({e}). Record one with "
                "`rlherd collect RUN --episodes N --out ID`, fetch one with `minari download "
                "ID`, or point MINARI_DATASETS_PATH at the directory that holds it"
            ) from None
        raise ConfigError(
            f"dataset {dataset_id!r} in {where} is damaged or not a Minari dataset ({e}); "
            f"remove it with `minari delete {dataset_id}` and record or download it again"
        ) from None


def about(dataset: Any) -> dict[str, Any]:
    """What rlherd recorded about ``dataset`` (``{}`` for datasets from elsewhere)."""
    return json.loads(dataset.storage.metadata.get(ABOUT_KEY, "{}"))


def recorded_env(dataset_id: str) -> str | None:
    """The environment ``dataset_id`` was recorded on, as ``--env`` takes it: rlherd's record,
    else Minari's environment spec; None where neither says."""
    dataset = load_dataset(dataset_id)
    env_spec = dataset.spec.env_spec
    return about(dataset).get("env") or (env_spec.id if env_spec is not None else None)


def episodes(dataset: Any) -> Iterator[Episode]:
    """The dataset's episodes, in order, each checked (:func:`_check_episode`)."""
    space = dataset.observation_space
    with _readable(dataset.spec.dataset_id):
        for i, e in enumerate(dataset.iterate_episodes()):
            yield _check_episode(i, dataset.action_space, Episode(
                read_observations(space, e.observations), np.asarray(e.actions),
                np.asarray(e.rewards, dtype=np.float32), np.asarray(e.terminations, dtype=bool),
                np.asarray(e.truncations, dtype=bool)))  # fmt: skip


def _check_episode(index: int, action_space: gym.Space, episode: Episode) -> Episode:
    """``episode`` (the ``index``-th), if it holds what :func:`fill` reads: as many actions,
    terminations and truncations as rewards, one observation more, and actions within their
    space (out of it, an offline learner indexed past its Q-values, demonstrations taught moves
    that do not exist, and a tanh policy's log-probability of a continuous one was NaN). A
    fault raises ``ValueError``, which :func:`_readable` words as a damaged dataset."""
    steps, obs = len(episode), episode.observations
    rows = [("actions", len(episode.actions), steps),
            ("terminations", len(episode.terminations), steps),
            ("truncations", len(episode.truncations), steps),
            *[(f"observations{'' if key is None else f' of {key}'}", len(x), steps + 1)
              for key, x in (obs.items() if isinstance(obs, dict) else [(None, obs)])]]  # fmt: skip
    for name, count, want in rows:
        if count != want:
            raise ValueError(f"episode {index} has {count} {name}, not the {want} of its "
                             f"{steps} steps")  # fmt: skip
    if steps and not _within(action_space, episode.actions):
        raise ValueError(f"episode {index} has actions outside its {action_space}")
    return episode


def _within(space: gym.Space, actions: np.ndarray) -> bool:
    """Whether each of ``actions`` (one row per step) lies in ``space``, all rows at once
    (``space.contains`` row by row would cost seconds on a large dataset). A continuous action
    may stray past its bounds by float32 rounding; NaN never passes."""
    if isinstance(space, gym.spaces.Discrete):
        low, high = space.start, space.start + space.n - 1
    elif isinstance(space, gym.spaces.MultiDiscrete | gym.spaces.MultiBinary | gym.spaces.Box):
        if actions.shape[1:] != space.shape:
            return False
        if isinstance(space, gym.spaces.MultiBinary):
            low, high = 0, 1
        elif isinstance(space, gym.spaces.MultiDiscrete):
            low, high = space.start, space.start + space.nvec - 1
        else:
            low = space.low - 1e-6 * (1.0 + np.abs(space.low))
            high = space.high + 1e-6 * (1.0 + np.abs(space.high))
    else:
        return True
    return bool(((actions >= low) & (actions <= high)).all())


def read_observations(space: gym.Space, stored: Any) -> Observations:
    """An episode's observations as stored under ``space``, laid out as :func:`rlherd.envs.make`
    lays out that space's observations (:func:`rlherd.core.flatten_space`): nested ``Dict`` and
    ``Tuple`` observations (a dataset recorded elsewhere, on an unwrapped environment) as one
    level of named arrays, ``Discrete`` values counted from 0, leaves that are not arrays left
    out. Every array is given its space's dtype, which an agent's tables are made for: Minari's
    HDF5 storage keeps every dtype as written (uint8, int8, int16, bool, ...), but a dataset
    written by other code, or kept in another storage, need not hold its space's."""
    flat, _ = flatten_space(space)
    leaves = map_obs(np.asarray, flatten_value(space, stored))
    if isinstance(flat, gym.spaces.Dict):
        return {k: leaves[k].astype(sub.dtype, copy=False) for k, sub in flat.spaces.items()}
    return leaves.astype(flat.dtype, copy=False)


def _describe(obs: Leaf | dict[str, Leaf]) -> str:
    """An observation's arrays as an error names them: ``(6,) float32 box``, or one such per
    key."""
    if isinstance(obs, dict):
        return "{" + ", ".join(f"{key}: {_describe(leaf)}" for key, leaf in obs.items()) + "}"
    categories = f"({obs.categories})" if obs.categories else ""
    return f"{obs.shape} {obs.dtype} {obs.kind}{categories}"


def _env_flags(env_id: str, env_kwargs: dict[str, Any]) -> str:
    """An environment as ``rlherd train``'s flags give it: ``--env ID``, and its options as
    ``--env-kwargs`` takes them, where it has any."""
    options = f" --env-kwargs '{json.dumps(env_kwargs)}'" if env_kwargs else ""
    return f"--env {env_id}{options}"


def check_matches(dataset: Any, spec: EnvSpec, env_id: str, env_kwargs: dict[str, Any]) -> None:
    """Refuse a dataset recorded on another environment than the run's: by the env id and
    kwargs rlherd recorded, and by the observation and action spaces. The line names the flags
    that match the recording, options too: where only the options differ, ``--env`` alone is
    the flag the run already has."""
    recorded = about(dataset)
    theirs_id, theirs_kwargs = recorded.get("env"), recorded.get("env_kwargs") or {}
    if recorded and (theirs_id, theirs_kwargs) != (env_id, env_kwargs):
        fix = _env_flags(theirs_id, theirs_kwargs)
        if env_kwargs and not theirs_kwargs:
            fix += " and no --env-kwargs"
        raise ConfigError(
            f"dataset {dataset.id!r} was recorded with {_env_flags(theirs_id, theirs_kwargs)}, "
            f"not {_env_flags(env_id, env_kwargs)}; train with {fix}"
        )
    theirs = EnvSpec.from_spaces(env_id, dataset.observation_space, dataset.action_space)
    for name in ("obs", "action_kind", "num_actions", "action_shape"):
        recorded, ours = getattr(theirs, name), getattr(spec, name)
        if recorded != ours:
            if name == "obs":
                recorded, ours = _describe(recorded), _describe(ours)
            raise ConfigError(
                f"dataset {dataset.id!r} has {name} {recorded}, but {env_id} has {ours}: it was "
                "recorded on another environment"
            )


def fill(adder: Any, episodes: Iterable[Episode]) -> int:
    """Write every step of ``episodes`` (a dataset's: :func:`episodes`) through ``adder`` (a
    builder's adder for one environment, a :class:`~rlherd.replay.adders.BatchAdder`); the
    number of steps written."""
    steps = 0
    first, no_skip = np.ones(1, dtype=bool), np.zeros(1, dtype=bool)
    for episode in episodes:
        obs = episode.observations
        adder.add_first(_row(obs, 0), first)
        for t in range(len(episode)):
            adder.add(episode.actions[t:t + 1], episode.rewards[t:t + 1], _row(obs, t + 1),
                      episode.terminations[t:t + 1], episode.truncations[t:t + 1], no_skip)
        steps += len(episode)
    return steps


def _row(obs: Observations, t: int) -> Observations:
    """Row ``t`` of an episode's observations, as a batch of one environment's."""
    return map_obs(lambda x: x[t : t + 1], obs)
