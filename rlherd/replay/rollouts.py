"""On-policy rollouts: the buffers an actor writes and a learner reads, owned by the runtime.

An on-policy agent's builder declares the fields its actor writes per row (``rollout_fields``:
the agent's outputs, e.g. ``action``, ``policy_logits``, ``baseline``); :func:`rollout_layout`
adds what every rollout has (``obs``, ``reset``, ``reward``, ``terminated``, ``truncated``). The
actor writes through a :class:`RolloutWriter` row by row into a ``[T + 1, B]`` rollout (the layout
of :mod:`rlherd.types`); where the full rollout goes is the runtime's choice, made by the
writer's ``on_full``: a queue in one process (:class:`RolloutQueue`), a shared-memory slot
(``mono``), a batching queue (``poly``). Consecutive rollouts overlap by the bootstrap row, as in
TorchBeast: row ``T`` of one rollout is row 0 of the next.

A recurrent actor passes its state before each row as ``core_state``; the rollout keeps the state
before row 0 as ``core_state.0``, ``core_state.1``, ... (each ``[layers, B, H]``, so rollouts
of several actors join along dimension 1 like every other field).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from rlherd import types as F
from rlherd.core import EnvSpec

Fields = dict[str, tuple[tuple[int, ...], torch.dtype]]  # name -> (shape per env, dtype)
Rollout = dict[str, torch.Tensor]

# Written by add_outcome (and reset from the flags); every other field is written by add_row.
OUTCOME_FIELDS = (F.REWARD, F.TERMINATED, F.TRUNCATED)


def obs_dtype(spec: EnvSpec) -> torch.dtype:
    """Images stay uint8 in rollouts (a quarter of the memory); every other array observation
    is float32."""
    return torch.uint8 if spec.obs_dtype == np.uint8 else torch.float32


def leaf_dtype(dtype: np.dtype) -> torch.dtype:
    """How an array of a dict observation is stored: in its own dtype (glyph codes stay int16,
    masks int8), except float64, which networks read as float32 anyway."""
    return torch.float32 if dtype == np.float64 else torch.from_numpy(np.zeros(0, dtype)).dtype


def obs_layout(spec: EnvSpec, name: str = F.OBS) -> Fields:
    """The fields an observation is stored as (:func:`rlherd.types.obs_fields`)."""
    if not spec.structured:
        return {name: (spec.obs_shape, obs_dtype(spec))}
    return {f"{name}.{k}": (leaf.shape, leaf_dtype(leaf.dtype)) for k, leaf in spec.obs.items()}


def rollout_layout(spec: EnvSpec, agent_fields: Fields) -> Fields:
    """Every field of a rollout: the observation, the agent's outputs, the outcome."""
    return {
        **obs_layout(spec),
        F.RESET: ((), torch.bool),
        **agent_fields,
        F.REWARD: ((), torch.float32),
        F.TERMINATED: ((), torch.bool),
        F.TRUNCATED: ((), torch.bool),
    }


def core_state_keys(n: int) -> list[str]:
    return [f"{F.CORE_STATE}.{j}" for j in range(n)]


def core_state_of(rollout: Rollout) -> tuple[torch.Tensor, ...]:
    """The recurrent state before row 0 (``()`` for feed-forward agents)."""
    keys = sorted(k for k in rollout if k.startswith(F.CORE_STATE + "."))
    return tuple(rollout[k] for k in keys)


def allocate_rollout(
    fields: Fields,
    unroll_length: int,
    num_envs: int,
    state: tuple[torch.Tensor, ...] = (),
    share_memory: bool = False,
    device: str | torch.device = "cpu",
) -> Rollout:
    """Zeroed ``[T + 1, B, ...]`` buffers for ``fields`` on ``device`` and room for the recurrent
    state (shaped like ``state``, e.g. ``policy.initial_state(B)``)."""
    rows = (unroll_length + 1, num_envs)
    out = {
        k: torch.zeros(rows + tuple(shape), dtype=dt, device=device)
        for k, (shape, dt) in fields.items()
    }
    for key, s in zip(core_state_keys(len(state)), state, strict=True):
        out[key] = torch.zeros_like(s, device=device)
    if share_memory:
        for t in out.values():
            t.share_memory_()
    return out


def join(rollouts: list[Rollout]) -> Rollout:
    """Rollouts of several actors as one batch (along the environment dimension): new tensors,
    except that a single rollout is returned as it is."""
    if len(rollouts) == 1:
        return rollouts[0]
    return {k: torch.cat([r[k] for r in rollouts], dim=1) for k in rollouts[0]}


class RolloutWriter:
    """The adder of an on-policy actor: ``add_row(core_state=..., **outputs)`` writes row ``t``
    (the observation's fields and the agent's outputs);
    ``add_outcome(reward, terminated, truncated)`` completes it and moves to ``t + 1``. Writing
    row ``T`` completes the rollout: ``on_full`` gets it and returns the buffer the next rollout
    is written into (the same one, once it has been copied out, or another); that buffer's row 0
    becomes this rollout's row ``T``.

    ``reset[t + 1]`` is set from row ``t``'s flags, so autoreset rows are marked without the
    actor being told.
    """

    def __init__(self, buffer: Rollout, on_full: Callable[[Rollout], Rollout]):
        missing = {F.RESET, *OUTCOME_FIELDS} - set(buffer)
        if missing:
            raise ValueError(f"rollout fields must include {sorted(missing)}")
        self.buffer, self.on_full = buffer, on_full
        self.T, self.B = buffer[F.REWARD].shape[0] - 1, buffer[F.REWARD].shape[1]
        self.state_keys = [k for k in buffer if k.startswith(F.CORE_STATE + ".")]
        self.t = 0
        buffer[F.RESET][0] = False  # a reused buffer (a restarted actor's slot) starts clean

    def add_row(self, core_state: tuple[torch.Tensor, ...] = (), **values: torch.Tensor) -> bool:
        """Write row ``t``; returns True when it completed a rollout."""
        for name, value in values.items():
            target = self.buffer.get(name)
            if target is None or name in OUTCOME_FIELDS or name == F.RESET:
                raise ValueError(
                    f"{name!r} is not a field the actor writes; the rollout has "
                    f"{sorted(k for k in self.buffer if k not in (*OUTCOME_FIELDS, F.RESET))}"
                )
            target = target[self.t]
            if value.shape != target.shape:
                raise ValueError(
                    f"rollout field {name!r}: expected shape {tuple(target.shape)} for "
                    f"{self.B} environments, got {tuple(value.shape)}"
                )
            target.copy_(value)
        if self.t == 0:
            for key, s in zip(self.state_keys, core_state, strict=True):
                self.buffer[key].copy_(s)
        if self.t < self.T:
            return False
        full = self.buffer
        # Row T carries over: copied first, since once handed over the rollout may be reused.
        carry = {k: v[self.T].clone() for k, v in full.items() if k not in self.state_keys}
        self.buffer = self.on_full(full)
        for k, v in carry.items():
            self.buffer[k][0] = v
        for key, s in zip(self.state_keys, core_state, strict=True):
            self.buffer[key].copy_(s)
        self.t = 0
        return True

    def add_outcome(
        self,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        skip: torch.Tensor | None = None,
    ) -> None:
        """Complete row ``t``. ``skip`` marks rows whose step was not a transition beyond the
        autoresets the flags already mark: a multi-agent game's rows whose agent is away. They
        are marked ``reset[t]`` too, so no loss reads them."""
        if self.t == self.T:
            raise RuntimeError("add_row must write the bootstrap row before the next outcome")
        self.buffer[F.REWARD][self.t] = reward
        self.buffer[F.TERMINATED][self.t] = terminated
        self.buffer[F.TRUNCATED][self.t] = truncated
        if skip is not None:
            self.buffer[F.RESET][self.t] |= skip
        self.buffer[F.RESET][self.t + 1] = terminated | truncated
        self.t += 1

    def state_dict(self) -> dict[str, Any]:
        return dict(buffer=self.buffer, t=self.t)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state["buffer"].items():
            self.buffer[k].copy_(v)
        self.t = state["t"]


class RolloutQueue(RolloutWriter):
    """Writer and dataset in one process (Acme feeds its PPO through a Reverb queue table; here
    the queue is a deque). Every full rollout is queued once (a copy); ``next()`` joins
    ``per_batch`` of them into a learner batch and ``ready()`` says whether one is waiting."""

    def __init__(self, buffer: Rollout, per_batch: int = 1):
        super().__init__(buffer, self._queue)
        self.per_batch = per_batch
        self.queue: deque[Rollout] = deque()

    def _queue(self, full: Rollout) -> Rollout:
        self.queue.append({k: v.clone() for k, v in full.items()})
        return full

    def ready(self) -> bool:
        return len(self.queue) >= self.per_batch

    def __iter__(self) -> Iterator[Rollout]:
        return self

    def __next__(self) -> Rollout:
        if not self.ready():
            raise RuntimeError("no full batch of rollouts yet; check ready() first")
        return join([self.queue.popleft() for _ in range(self.per_batch)])

    def state_dict(self) -> dict[str, Any]:
        return dict(super().state_dict(), queue=list(self.queue))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.queue = deque(state["queue"])
