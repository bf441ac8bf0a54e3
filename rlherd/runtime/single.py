"""The ``single`` runtime: everything in one process, deterministic for a seed.

An :class:`~rlherd.run.loop.EnvironmentLoop` (TensorFlow Agents' ``simulate``) steps
``num_envs`` environments with the agent's actor; after every step the learner steps for as long
as its dataset has a batch: while the replay tables' rate limiter lets it sample (inserts never
block in one process, as in Acme's local layout), or whenever ``batch_size`` environments'
rollouts are full (on-policy). The actor acts with its own copy of the networks, fetched from
the learner (its variable source) whenever the learner has stepped.

Checkpoints hold everything (learner, actor, adders or rollout buffers, replay, environments when
they pickle, RNGs), so ``--resume`` continues exactly; ale-py's native vector env does not
pickle, so there the episodes restart.

With ``record_dataset``, every episode the environments finish is kept (in checkpoints too) and
written as that Minari dataset when the run completes: D4RL's "medium-replay" recipe.
"""

from __future__ import annotations

from typing import Any

from rlherd.errors import ConfigError
from rlherd.replay import offline
from rlherd.replay.recording import RecordingAlgorithm
from rlherd.replay.rollouts import RolloutQueue, allocate_rollout, rollout_layout
from rlherd.run.loop import ActorAlgorithm, EnvironmentLoop
from rlherd.runtime import (
    RunContext,
    checkpoint_state,
    load_tables,
    set_rng_state,
    table_states,
    with_demonstrations,
)


def _recording(ctx: RunContext) -> dict[str, Any]:
    """The checkpoint's episodes recorded so far (``record_dataset``); a run trained without
    it, whose config.json was given it afterwards, has none: one line, not a ``TypeError``."""
    if ctx.checkpoint.get("recording") is None:
        raise ConfigError(f"{ctx.checkpoint_file} holds no recorded episodes: the run was "
                          "trained without record_dataset, which its config.json now sets; "
                          "remove it there, or record a dataset with rlherd collect")  # fmt: skip
    return ctx.checkpoint["recording"]


def run(ctx: RunContext) -> None:
    builder, spec, settings = ctx.builder, ctx.spec, ctx.settings
    device = settings.device
    networks = builder.make_networks(spec, device)
    policy = builder.make_policy(builder.make_networks(spec, device))  # the actor's copy
    if builder.dataflow == "replay":
        num_envs = settings.num_envs or 1
        tables = builder.make_replay_tables(spec, insert_blocking=False)
        dataset = builder.make_dataset(tables, device)
        dataset, checkpointed = with_demonstrations(ctx, dataset, tables, ctx.seed)
        adder = builder.make_adder(tables, num_envs)
        ready = dataset.ready
    else:
        num_envs = settings.num_envs or builder.batch_size
        if builder.batch_size % num_envs:
            raise ConfigError(
                f"batch_size ({builder.batch_size}) must be a multiple of num_envs ({num_envs})"
            )
        tables = checkpointed = []
        buffer = allocate_rollout(rollout_layout(spec, builder.rollout_fields(spec)),
                                  builder.unroll_length, num_envs, policy.initial_state(num_envs))
        dataset = adder = RolloutQueue(buffer, builder.batch_size // num_envs)  # fmt: skip
        ready = dataset.ready
    learner = builder.make_learner(networks, dataset, ctx.learner_budget, tables)
    actor = builder.make_actor(ctx.seed, policy, spec, adder, learner)
    actor.update(wait=True)
    algorithm = ActorAlgorithm(actor, learner, ready, on_learn=ctx.recorder.learner)
    if settings.record_dataset:
        if ctx.checkpoint is None:
            offline.check_free(settings.record_dataset)
        algorithm = RecordingAlgorithm(algorithm)
    envs = ctx.make_envs(num_envs, settings.env_workers)
    loop = EnvironmentLoop(envs, algorithm, ctx.recorder, ctx.seed)
    if ctx.checkpoint is not None:
        with ctx.restoring():
            learner.load_state_dict(ctx.checkpoint["learner"])
            actor.load_state_dict(ctx.checkpoint["actor"])
            actor.update(wait=True)
            load_tables(checkpointed, ctx.checkpoint["tables"])
            restored = loop.load_state_dict(ctx.checkpoint["loop"])
            ctx.resumed_envs(loop.envs, restored)  # the restored ones, where they were
            set_rng_state(ctx.checkpoint["rng"])
            if settings.record_dataset:
                algorithm.load_state_dict(_recording(ctx))

    def state() -> dict[str, Any]:
        recording = algorithm.state_dict() if settings.record_dataset else None
        return checkpoint_state(learner, ctx.recorder, actor=actor.state_dict(),
                                loop=loop.state_dict(), tables=table_states(checkpointed, settings),
                                recording=recording)  # fmt: skip

    try:
        while not ctx.recorder.done() and not ctx.stop.is_set():
            loop.step()
            ctx.tick(state, learner)
        ctx.finish(state, learner)
        if settings.record_dataset and ctx.recorder.done():
            about = dict(env=ctx.env_id, env_kwargs=ctx.env_kwargs, seed=ctx.seed,
                         policy=f"training episodes of {ctx.builder.name}")  # fmt: skip
            offline.write_dataset(settings.record_dataset, algorithm.finished,
                                  loop.envs.single_observation_space,
                                  loop.envs.single_action_space, about)  # fmt: skip
    finally:
        loop.envs.close()
        if hasattr(dataset, "close"):
            dataset.close()
