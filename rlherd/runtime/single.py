"""The ``single`` runtime: everything in one process, deterministic for a seed.

- On-policy agents (IMPALA): step ``batch_size`` environments for ``unroll_length`` steps, learn
  on that rollout, repeat.
- Agents that act step by step (DQN, PPO): an :class:`~rlherd.run.loop.EnvironmentLoop`
  (TensorFlow Agents' ``simulate``) steps ``num_envs`` environments; after every step the learner
  steps for as long as its dataset has a batch: while the replay table's rate limiter lets it
  sample (inserts never block in one process, as in Acme's local layout), or once per full
  rollout for PPO.

Checkpoints hold everything (learner, actor, adders, replay, environments when they pickle, RNGs),
so ``--resume`` continues exactly; ale-py's native vector env does not pickle, so there the
episodes restart.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from rlherd.agents.impala.acting import allocate_rollout, rollout_fields
from rlherd.core import EnvSpec
from rlherd.run.loop import ActorAlgorithm, EnvironmentLoop
from rlherd.run.recorder import Recorder
from rlherd.runtime import checkpoint_state, set_rng_state


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
    run = _run_loop if builder.uses_loop else _run_rollouts
    run(builder, spec, recorder, seed, checkpoint, save, stop, evaluator)


def _run_rollouts(builder, spec, recorder, seed, checkpoint, save, stop, evaluator) -> None:
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
        return checkpoint_state(learner, recorder, actor=actor.state_dict())

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


def _run_loop(builder, spec, recorder, seed, checkpoint, save, stop, evaluator) -> None:
    config = builder.config
    net = builder.make_networks(spec)
    tables = builder.make_replay_tables(spec, insert_blocking=False)
    dataset = builder.make_dataset(tables)
    adder = builder.make_adder(tables, config.num_envs)
    actor = builder.make_actor(net, adder, seed)
    learner = builder.make_learner(net, recorder.total_steps, dataset, tables)
    algorithm = ActorAlgorithm(actor, learner, on_learn=recorder.learner)
    loop = EnvironmentLoop(builder.make_envs(config.num_envs), algorithm, recorder, seed)
    save_tables = getattr(config, "checkpoint_replay", True)
    if checkpoint is not None:
        learner.load_state_dict(checkpoint["learner"])
        actor.load_state_dict(checkpoint["actor"])
        if checkpoint["tables"] is not None:
            for table, table_state in zip(tables, checkpoint["tables"], strict=True):
                table.load_state_dict(table_state)
        loop.load_state_dict(checkpoint["loop"])
        set_rng_state(checkpoint["rng"])

    def state() -> dict[str, Any]:
        return checkpoint_state(
            learner,
            recorder,
            actor=actor.state_dict(),
            loop=loop.state_dict(),
            tables=[t.state_dict() for t in tables] if save_tables else None,
        )

    try:
        while not recorder.done() and not stop.is_set():
            loop.step()
            if evaluator is not None:
                evaluator.maybe_run(net.state_dict)
            if recorder.tick():
                save(state())
        save(state())
    finally:
        loop.envs.close()
        dataset.close()
