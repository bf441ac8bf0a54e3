"""On-policy rollouts: the adder and the dataset of agents that learn from each step once (PPO).

Acme feeds its PPO through a Reverb queue table; in one process the queue and the writer are one
object. :class:`RolloutQueue` writes the steps of ``B`` environments row by row into a
``[T + 1, B]`` rollout (the layout of :mod:`rlherd.types`), queues every full rollout once, and
serves them to the learner in order. Consecutive rollouts overlap by the bootstrap row, as in
TorchBeast: row ``T`` of one rollout is row 0 of the next.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

from rlherd import types as F

Fields = dict[str, tuple[tuple[int, ...], torch.dtype]]  # name -> (shape per env, dtype)

# Written by add_outcome; every other field is written by add_row.
OUTCOME_FIELDS = (F.REWARD, F.TERMINATED, F.TRUNCATED)


class RolloutQueue:
    """``add_row(**policy_outputs)`` writes row ``t``; ``add_outcome(reward, terminated,
    truncated)`` completes it and moves to ``t + 1``. Writing row ``T`` completes a rollout, which
    is queued (a copy) and served by ``next()``; ``ready()`` says whether one is waiting.

    ``reset[t + 1]`` is set from row ``t``'s flags, so the rows that are autoreset steps are
    marked without the writer being told.
    """

    def __init__(self, fields: Fields, unroll_length: int, num_envs: int, max_queued: int = 1):
        missing = {F.OBS, F.RESET, *OUTCOME_FIELDS} - set(fields)
        if missing:
            raise ValueError(f"rollout fields must include {sorted(missing)}")
        self.fields, self.T, self.B, self.max_queued = fields, unroll_length, num_envs, max_queued
        rows = (unroll_length + 1, num_envs)
        self.buffer = {k: torch.zeros(rows + shape, dtype=dt) for k, (shape, dt) in fields.items()}
        self.t = 0
        self.queue: deque[dict[str, torch.Tensor]] = deque()

    def add_row(self, **values: torch.Tensor) -> None:
        for name, value in values.items():
            if name in OUTCOME_FIELDS or name == F.RESET:
                raise ValueError(f"{name} is written by add_outcome, not add_row")
            target = self.buffer[name][self.t]
            if value.shape != target.shape:
                raise ValueError(
                    f"rollout field {name!r}: expected shape {tuple(target.shape)} for "
                    f"{self.B} environments, got {tuple(value.shape)}"
                )
            target.copy_(value)
        if self.t == self.T:
            if len(self.queue) >= self.max_queued:
                raise RuntimeError(
                    f"{len(self.queue)} rollouts wait for the learner; call next() (learner.step) "
                    "before writing more"
                )
            self.queue.append({k: v.clone() for k, v in self.buffer.items()})
            for v in self.buffer.values():
                v[0] = v[self.T]
            self.t = 0

    def add_outcome(
        self, reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor
    ) -> None:
        if self.t == self.T:
            raise RuntimeError("add_row must write the bootstrap row before the next outcome")
        self.buffer[F.REWARD][self.t] = reward
        self.buffer[F.TERMINATED][self.t] = terminated
        self.buffer[F.TRUNCATED][self.t] = truncated
        self.buffer[F.RESET][self.t + 1] = terminated | truncated
        self.t += 1

    # The dataset side ---------------------------------------------------------------------------
    def ready(self) -> bool:
        return bool(self.queue)

    def __iter__(self) -> RolloutQueue:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if not self.queue:
            raise RuntimeError("no full rollout yet; check ready() first")
        return self.queue.popleft()

    def close(self) -> None:
        self.queue.clear()

    def state_dict(self) -> dict[str, Any]:
        return dict(buffer=self.buffer, t=self.t, queue=list(self.queue))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state["buffer"].items():
            self.buffer[k].copy_(v)
        self.t = state["t"]
        self.queue = deque(state["queue"])
