"""Adders turn one environment's stream of steps into replay items (Acme's adders).

An actor calls ``add_first(obs)`` at the start of an episode and ``add(action, reward, next_obs,
terminated, truncated, extras)`` after every step; the adder writes items into a table:

- :class:`NStepTransitionAdder`: ``obs, action, reward, discount, next_obs`` (+ extras), where
  ``reward`` is the discounted sum of up to ``n`` rewards and ``discount`` the factor for
  bootstrapping from ``next_obs``: ``gamma ** m`` after ``m`` steps, 0 if the episode terminated.
  Near an episode end the windows shrink, so every step starts exactly one transition.
- :class:`SequenceAdder`: fixed-length sequences of rows every ``period`` steps (R2D2).
- :class:`EpisodeAdder`: whole episodes.

Sequence and episode rows follow rlherd's trajectory layout (:mod:`rlherd.types`): row ``t`` holds
``obs[t]``, the ``action`` taken there and its outcome (``reward``, ``terminated``,
``truncated``); an episode's final observation is a row of its own with ``reset`` true and
nothing taken. ``mask`` marks real rows (false on padding).

:class:`BatchAdder` fans a batched actor's steps out to one adder per environment.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from rlherd import types as F
from rlherd.core import EnvSpec
from rlherd.replay.table import Signature, Table

PriorityFn = Callable[[dict[str, np.ndarray]], float]


def obs_signature(spec: EnvSpec, name: str) -> Signature:
    """The fields an observation is stored as in an item (:func:`rlherd.types.obs_fields`),
    each array in its own dtype."""
    if not spec.structured:
        return {name: (spec.obs_shape, spec.obs_dtype)}
    return {f"{name}.{k}": (leaf.shape, leaf.dtype) for k, leaf in spec.obs.items()}


def _as_arrays(obs: Any) -> Any:
    return F.map_obs(np.asarray, obs)


def _action_field(spec: EnvSpec) -> tuple[tuple[int, ...], Any]:
    if spec.action_kind == "discrete":
        return (), np.int64
    return spec.action_shape, np.float32


class NStepTransitionAdder:
    def __init__(
        self,
        table: Table,
        n: int,
        discount: float,
        priority_fn: PriorityFn | None = None,
    ):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.table, self.n, self.discount, self.priority_fn = table, n, discount, priority_fn
        self.pending: deque[tuple] = deque()
        self.obs: np.ndarray | None = None

    @staticmethod
    def signature(spec: EnvSpec, extras: Signature | None = None) -> Signature:
        return dict(
            **obs_signature(spec, "obs"),
            action=_action_field(spec),
            reward=((), np.float32),
            discount=((), np.float32),
            **obs_signature(spec, "next_obs"),
            **(extras or {}),
        )

    def add_first(self, obs) -> None:
        self.pending.clear()
        self.obs = _as_arrays(obs)

    def add(self, action, reward, next_obs, terminated, truncated, extras=None) -> None:
        if self.obs is None:
            raise RuntimeError("call add_first(obs) at the start of every episode")
        self.pending.append((self.obs, action, float(reward), extras or {}))
        self.obs = _as_arrays(next_obs)
        if terminated or truncated:
            while self.pending:
                self._write(len(self.pending), bool(terminated))
            self.obs = None
        elif len(self.pending) == self.n:
            self._write(self.n, False)

    def _write(self, steps: int, terminated: bool) -> None:
        """Write the transition of the oldest pending step, ``steps`` rewards long."""
        obs, action, _, extras = self.pending[0]
        ret = sum(self.discount**k * self.pending[k][2] for k in range(steps))
        item = dict(
            **F.obs_fields("obs", obs),
            action=action,
            reward=np.float32(ret),
            discount=np.float32(0.0 if terminated else self.discount**steps),
            **F.obs_fields("next_obs", self.obs),
            **extras,
        )
        self.table.insert(item, self.priority_fn(item) if self.priority_fn else 1.0)
        self.pending.popleft()

    def state_dict(self) -> dict[str, Any]:
        return dict(pending=list(self.pending), obs=self.obs)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = deque(state["pending"])
        self.obs = state["obs"]


class _RowAdder:
    """Shared by the sequence and episode adders: builds rows in the trajectory layout."""

    def __init__(self, table: Table, priority_fn: PriorityFn | None, state_keys: tuple[str, ...]):
        self.table, self.priority_fn, self.state_keys = table, priority_fn, state_keys
        self.row_fields = {  # per-row shapes: the table's, less the leading time dimension
            k: (shape[1:], dtype)
            for k, (shape, dtype) in table.signature.items()
            if k not in state_keys and k != "mask"
        }
        self.rows: deque[dict[str, np.ndarray]] = deque()
        self.open: dict[str, Any] | None = None  # the row whose action is not yet known

    @staticmethod
    def row_signature(spec: EnvSpec, extras: Signature | None) -> Signature:
        return dict(
            **obs_signature(spec, "obs"),
            action=_action_field(spec),
            reward=((), np.float32),
            terminated=((), np.bool_),
            truncated=((), np.bool_),
            reset=((), np.bool_),
            first=((), np.bool_),
            **(extras or {}),
        )

    def _blank_row(self, obs, first: bool, reset: bool) -> dict[str, Any]:
        row = {k: np.zeros(shape, dtype) for k, (shape, dtype) in self.row_fields.items()}
        for k in self.state_keys:  # a row with nothing taken carries a zero state
            shape, dtype = self.table.signature[k]
            row[k] = np.zeros(shape, dtype)
        row.update(F.obs_fields("obs", _as_arrays(obs)), first=first, reset=reset)
        return row

    def _start(self, obs) -> None:
        self.open = self._blank_row(obs, first=True, reset=False)

    def _step(self, action, reward, next_obs, terminated, truncated, extras) -> bool:
        """Complete the open row; open the next. True at the episode's end."""
        if self.open is None:
            raise RuntimeError("call add_first(obs) at the start of every episode")
        row = self.open
        row.update(action=action, reward=reward, terminated=terminated, truncated=truncated)
        row.update(extras or {})
        self.rows.append(row)
        ended = bool(terminated or truncated)
        self.open = self._blank_row(next_obs, first=False, reset=ended)
        if ended:
            self.rows.append(self.open)  # the final observation, a row with nothing taken
            self.open = None
        return ended

    def _write(self, rows: list[dict[str, Any]], length: int) -> None:
        """Write ``rows`` padded to ``length`` (``mask`` false on padding)."""
        item: dict[str, Any] = {}
        for k, (shape, dtype) in self.row_fields.items():
            column = np.zeros((length, *shape), dtype=dtype)
            column[: len(rows)] = [r[k] for r in rows]
            item[k] = column
        item["mask"] = np.arange(length) < len(rows)
        for k in self.state_keys:
            item[k] = rows[0][k]
        self.table.insert(item, self.priority_fn(item) if self.priority_fn else 1.0)

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k not in ("table", "priority_fn")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self.rows = deque(self.rows)  # a checkpoint gives a deque back as a list


class SequenceAdder(_RowAdder):
    """Sequences of ``length`` rows starting every ``period`` rows (R2D2, Kapturowski et al.).

    ``end_of_episode``:
      - ``"pad"``: every sequence that starts inside the episode (with at least one step taken)
        is written, zero-padded after the final observation;
      - ``"truncate"``: the first sequence not yet written is cut at the final observation and
        written as a shorter one (padded in storage, ``mask`` gives its length); later starts,
        which it contains, are dropped;
      - ``"continue"``: sequences run on across episodes; ``first`` and ``reset`` rows tell a
        recurrent learner where to reset its state.

    ``state_keys`` name extras stored once per sequence, from its first row (e.g. the recurrent
    state the actor had before reading that row); other extras are stored per row.
    """

    END_OF_EPISODE = ("pad", "truncate", "continue")

    def __init__(
        self,
        table: Table,
        length: int,
        period: int,
        end_of_episode: str = "pad",
        state_keys: tuple[str, ...] = (),
        priority_fn: PriorityFn | None = None,
    ):
        if not 1 <= period <= length:
            raise ValueError(f"need 1 <= period <= length, got period={period}, length={length}")
        if end_of_episode not in self.END_OF_EPISODE:
            raise ValueError(f"end_of_episode must be one of {self.END_OF_EPISODE}")
        super().__init__(table, priority_fn, state_keys)
        self.length, self.period, self.end_of_episode = length, period, end_of_episode
        self.until_start = 0  # rows until the next sequence starts (0: the next row starts one)

    @staticmethod
    def signature(
        spec: EnvSpec, length: int, extras: Signature | None = None, state: Signature | None = None
    ) -> Signature:
        rows = _RowAdder.row_signature(spec, extras)
        sig = {k: ((length, *shape), dtype) for k, (shape, dtype) in rows.items()}
        return dict(sig, mask=((length,), np.bool_), **(state or {}))

    def add_first(self, obs) -> None:
        if self.end_of_episode != "continue":
            self.rows.clear()
            self.until_start = 0
        self._start(obs)

    def add(self, action, reward, next_obs, terminated, truncated, extras=None) -> None:
        ended = self._step(action, reward, next_obs, terminated, truncated, extras)
        self._emit_full()
        if ended and self.end_of_episode != "continue":
            self._flush()

    def _emit_full(self) -> None:
        """Write every sequence whose ``length`` rows are all in; keep what later ones need."""
        while len(self.rows) >= self.until_start + self.length:
            for _ in range(self.until_start):
                self.rows.popleft()
            self._write(list(self.rows)[: self.length], self.length)
            self.until_start = self.period

    def _flush(self) -> None:
        """The episode ended (pad / truncate): write its pending partial sequences."""
        rows = list(self.rows)[self.until_start :]
        while len(rows) > 1:  # a sequence needs at least one step taken
            self._write(rows[: self.length], self.length)
            if self.end_of_episode == "truncate":
                break
            rows = rows[self.period :]
        self.rows.clear()
        self.until_start = 0


class EpisodeAdder(_RowAdder):
    """Whole episodes, written when they end, padded to ``max_length`` rows (the final
    observation included)."""

    def __init__(
        self,
        table: Table,
        max_length: int,
        state_keys: tuple[str, ...] = (),
        priority_fn: PriorityFn | None = None,
    ):
        super().__init__(table, priority_fn, state_keys)
        self.max_length = max_length

    @staticmethod
    def signature(
        spec: EnvSpec, max_length: int, extras: Signature | None = None,
        state: Signature | None = None,
    ) -> Signature:  # fmt: skip
        return SequenceAdder.signature(spec, max_length, extras, state)

    def add_first(self, obs) -> None:
        self.rows.clear()
        self._start(obs)

    def add(self, action, reward, next_obs, terminated, truncated, extras=None) -> None:
        if len(self.rows) + 2 > self.max_length:
            raise ValueError(
                f"episode longer than max_length={self.max_length} rows; raise max_length "
                "(the episode's steps plus one for its final observation)"
            )
        if self._step(action, reward, next_obs, terminated, truncated, extras):
            self._write(list(self.rows), self.max_length)
            self.rows.clear()


class BatchAdder:
    """One adder per environment of a batched actor.

    ``add_first(obs, envs)`` starts episodes in the given environments; ``add`` takes ``[B]``
    arrays and skips environments in ``skip`` (Gymnasium's autoreset steps, whose action was
    ignored: the actor calls ``add_first`` for those instead).
    """

    def __init__(self, adders: list):
        self.adders = adders

    def add_first(self, obs: np.ndarray, envs: np.ndarray) -> None:
        for i in np.flatnonzero(envs):
            self.adders[i].add_first(F.map_obs(lambda x, i=i: x[i], obs))

    def add(self, action, reward, next_obs, terminated, truncated, skip, extras=None) -> None:
        for i in np.flatnonzero(~np.asarray(skip)):
            ex = {k: v[i] for k, v in extras.items()} if extras else None
            obs = F.map_obs(lambda x, i=i: x[i], next_obs)
            self.adders[i].add(action[i], reward[i], obs, terminated[i], truncated[i], ex)

    def state_dict(self) -> list[dict[str, Any]]:
        return [a.state_dict() for a in self.adders]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        for adder, s in zip(self.adders, state, strict=True):
            adder.load_state_dict(s)
