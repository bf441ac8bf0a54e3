"""Runtimes decide where an agent's pieces run; the agent code is the same in each.

- ``single``: one process steps a batch of environments, acting and learning in turn.
- ``mono``: MonoBeast; actor processes fill shared-memory rollout slots for a learner.
- ``poly``: PolyBeast; environment servers over gRPC, actor threads, dynamic batching of
  inference on the learner's device.
- ``device``: WarpDrive; environments, sampling, rollouts and learning on one torch device.
"""

from __future__ import annotations

import contextlib
import ctypes
import random
import signal
import threading
from typing import Any

import numpy as np
import torch

RUNTIMES = ("single", "mono", "poly", "device")


class GracefulStop:
    """Turns the first SIGINT / SIGTERM into a request to stop at the next safe point (so the run
    can write its final checkpoint); a second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if self.event.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.event.set()

    def __enter__(self) -> threading.Event:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self.event

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies, so no actor or environment server
    is ever orphaned. Elsewhere there is no prctl; daemon processes still cover normal exits."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def checkpoint_state(learner, recorder, **parts: Any) -> dict[str, Any]:
    """What every runtime checkpoints (learner, counters, global RNGs) plus its own ``parts``."""
    return dict(
        learner=learner.state_dict(), recorder=recorder.state_dict(), rng=rng_state(), **parts
    )


def rng_state() -> dict[str, Any]:
    return dict(torch=torch.get_rng_state(), numpy=np.random.get_state(), python=random.getstate())


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
