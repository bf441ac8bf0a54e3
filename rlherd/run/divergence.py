"""Telling a learner that blew up from one that learns, while every number is still finite.

A learning rate far too high (``learning_rate=1e6``) does not always overflow: Adam moves every
weight by about the learning rate per step whatever the gradient, so the weights reach 1e10
and stay finite, the policy collapses, and the run would go on to its budget and report a
return as if it had trained. :class:`DivergenceWatch` stops such a run with
:class:`~rlherd.errors.TrainingDiverged`, judging each learner against its own start.

Two signals, each against its own reference:

- **The parameters' global norm**, against its value before the first update. This is the main
  signal. Its reference is fixed before any update can spoil it (a learner that blows up in its
  first step, as PPO does when its 20 epochs run at ``learning_rate=1e6``, has no clean "early
  losses" to compare with); it does not scale with the task's rewards or returns; in healthy
  training it drifts slowly (an Adam step moves each weight by at most about the learning
  rate); and weights that blew up stay up, so one reading above the threshold is enough.
  ``NORM_FACTOR`` (1000x) is far above what the shipped presets reach (at most 4.4x, DQN's
  CartPole test over 24,000 learner steps; 1.0-2.8x in the learning tests of PPO, IMPALA,
  R2D2, R2D3, DQfD, D4PG, DDPG, MPO, DMPO, MCTS, CQL, CRR and BC) and far below the 10^7x of a
  learner at ``learning_rate=1e6`` after 100 steps.
- **Each loss** (the metrics whose names hold ``loss``), against the largest absolute value of
  its first ``LOSS_WARMUP`` readings, floored at ``LOSS_FLOOR`` (a loss that starts near zero,
  as a sparse task's value loss does, is not a scale to multiply). This catches values that
  run away through bootstrapping faster than the weights grow. Losses grow legitimately as
  returns do (a CartPole value loss rises about 100x as returns go from 10 to 500, a squared
  error as the square of the returns' scale), and one batch can spike, so the factor is large
  (``LOSS_FACTOR``, 10^5) and it must hold for ``LOSS_PATIENCE`` readings in a row. In the same
  learning tests no loss went past 9.3x its early size.

The learner is read every ``CHECK_PERIOD`` (100) steps (see
:meth:`rlherd.agents.learning.NetworkLearner.step`) and before every checkpoint: one norm of the
parameters and a few scalar reads, 25 us on a CartPole DQN, so a share of 0.03% of its
updates' time, and on an accelerator one synchronisation per 100 updates
(``benchmarks/divergence_cost.py``). Read every 10 steps, it cost that DQN about 1% of its
updates per second (the reading is slower amid updates than alone); every 100, within about
0.5%, and a learner that blew up still stops within 100 steps (or at the next checkpoint).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rlherd.errors import TrainingDiverged

CHECK_PERIOD = 100  # learner steps between readings
NORM_FACTOR = 1e3  # the parameters' norm may grow this much over its value at the start
LOSS_FACTOR = 1e5  # a loss may grow this much over the largest of its first readings
LOSS_WARMUP = 10  # readings of a loss that make its reference
LOSS_PATIENCE = 3  # readings in a row above the limit before a loss counts as blown up
LOSS_FLOOR = 1.0  # the smallest reference a loss is measured against


def parameter_norm(params: Iterable[torch.Tensor]) -> float:
    """The global L2 norm of ``params``: one foreach call and one read."""
    tensors = [p.detach() for p in params]
    if not tensors:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors))))


@dataclass
class Series:
    """One watched quantity: its reference is the largest of its first ``warmup`` finite
    readings (at least ``floor``); it has blown up once ``patience`` readings in a row exceed
    ``factor`` times that."""

    factor: float
    warmup: int
    patience: int
    floor: float
    reference: float = 0.0
    readings: int = 0
    over: int = 0

    def add(self, value: float) -> float | None:
        """Take one reading; return how many times the reference it is, once blown up."""
        if not math.isfinite(value):
            return None  # non-finite values are the finiteness checks' to report
        if self.readings < self.warmup:
            self.readings += 1
            self.reference = max(self.reference, value, self.floor)
            return None
        ratio = value / self.reference
        self.over = self.over + 1 if ratio > self.factor else 0
        return ratio if self.over >= self.patience else None


class DivergenceWatch:
    """Watches one learner's parameter norm and losses (see the module's docstring) and raises
    :class:`TrainingDiverged` naming what blew up, by how much, at which step, and the fix."""

    def __init__(self, initial_norm: float, period: int = CHECK_PERIOD):
        self.period = period
        self.calls = 0
        self.norm = Series(NORM_FACTOR, warmup=1, patience=1, floor=1e-6)
        self.norm.add(initial_norm)
        self.losses: dict[str, Series] = {}

    def due(self) -> bool:
        """Count a learner step; True on every ``period``-th."""
        self.calls += 1
        return self.calls % self.period == 0

    def check_norm(self, step: int, norm: float) -> None:
        ratio = self.norm.add(norm)
        if ratio is not None:
            start = f"its value before the first update ({self.norm.reference:.3g})"
            self._stop(step, "the parameters' norm", norm, ratio, start)

    def check_losses(self, step: int, metrics: Mapping[str, Any]) -> None:
        for name, value in metrics.items():
            if "loss" not in name or not _is_scalar(value):
                continue
            series = self.losses.setdefault(
                name, Series(LOSS_FACTOR, LOSS_WARMUP, LOSS_PATIENCE, LOSS_FLOOR)
            )
            ratio = series.add(abs(float(value)))
            if ratio is not None:
                early = f"its early size ({series.reference:.3g})"
                self._stop(step, name, float(value), ratio, early)

    def observe(self, step: int, norm: float, metrics: Mapping[str, Any]) -> None:
        """One reading of the parameters' norm and of the losses among ``metrics``."""
        self.check_norm(step, norm)
        self.check_losses(step, metrics)

    @staticmethod
    def _stop(step: int, what: str, value: float, ratio: float, reference: str) -> None:
        raise TrainingDiverged(
            f"learner step {step}: {what} reached {value:.3g}, {ratio:.2g}x {reference}; "
            f"{TrainingDiverged.HINT}"
        )


def _is_scalar(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and value.is_floating_point()
    return isinstance(value, float)
