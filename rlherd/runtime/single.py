"""The ``single`` runtime: one process steps ``batch_size`` environments, then learns on the
rollout it just collected, in turn. Simple, deterministic for a seed, and resumable exactly when
the environments pickle (Gymnasium's do; ale-py's native vector env restarts its episodes)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from rlherd.agents.impala.acting import allocate_rollout, rollout_fields
from rlherd.core import EnvSpec
from rlherd.run.recorder import Recorder
from rlherd.runtime import rng_state, set_rng_state


def run_single(
    builder,
    spec: EnvSpec,
    recorder: Recorder,
    seed: int,
    checkpoint: dict[str, Any] | None,
    save: Callable[[dict[str, Any]], None],
    stop: threading.Event,
    evaluator=None,
) -> None:
    config = builder.config
    B, T = config.batch_size, config.unroll_length
    net = builder.make_networks(spec)
    actor = builder.make_actor(net, builder.make_envs(B), seed)
    rollout = allocate_rollout(rollout_fields(spec, B, T))

    def dataset() -> Iterator:
        while True:
            core_state = actor.unroll(rollout)
            recorder.rollout(rollout)
            yield rollout, core_state

    learner = builder.make_learner(net, recorder.total_steps, dataset())
    if checkpoint is not None:
        learner.load_state_dict(checkpoint["learner"])
        actor.load_state_dict(checkpoint["actor"])
        set_rng_state(checkpoint["rng"])

    def state() -> dict[str, Any]:
        return dict(
            learner=learner.state_dict(),
            actor=actor.state_dict(),
            recorder=recorder.state_dict(),
            rng=rng_state(),
        )

    try:
        while not recorder.done() and not stop.is_set():
            recorder.learner(learner.step())
            if evaluator is not None:
                evaluator.maybe_run(net.state_dict)
            if recorder.tick():
                save(state())
        save(state())
    finally:
        actor.envs.close()
