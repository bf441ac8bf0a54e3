"""The ``offline`` runtime: a learner and a fixed dataset, no actors (Acme's offline agents).

``rlherd train AGENT --env ENV --dataset ID`` reads the Minari dataset ``ID`` into the agent's
own replay tables through its own adder (:mod:`rlherd.replay.offline`), sized to hold all of it
and sampled without a rate limiter, then steps the learner ``--total-steps`` times. So any replay
agent (DQN, D4PG, MPO, ...) learns offline from exactly the items it would sample online, and
the agents made for it (BC, CQL, CRR) are ordinary replay agents that run only here.

No environment is stepped except by the evaluator, which plays the evaluation policy every
``--eval-every`` learner steps (every tenth of the run unless set). Checkpoints hold the
learner and the tables' sampling state (priorities, counts, RNG) but not the items: a resumed
run reads the dataset again, into the same slots, and continues exactly.
"""

from __future__ import annotations

from typing import Any

from rlherd.replay import offline
from rlherd.runtime import RunContext, checkpoint_state, set_rng_state


def check(builder: Any, settings: Any) -> None:
    """The dataset opens (a missing or damaged one is refused before the run directory is
    made)."""
    offline.load_dataset(settings.dataset)


def run(ctx: RunContext) -> None:
    builder, spec, settings = ctx.builder, ctx.spec, ctx.settings
    data = offline.load_dataset(settings.dataset)
    offline.check_matches(data, spec, ctx.env_id, ctx.env_kwargs)
    tables = builder.make_replay_tables(spec, insert_blocking=False, dataset_size=data.total_steps)
    offline.fill(builder.make_adder(tables, 1), offline.episodes(data))
    dataset = builder.make_dataset(tables, settings.device)
    networks = builder.make_networks(spec, settings.device)
    learner = builder.make_learner(networks, dataset, ctx.recorder.total_steps, tables)
    if ctx.checkpoint is not None:
        with ctx.restoring():
            learner.load_state_dict(ctx.checkpoint["learner"])
            for table, state in zip(tables, ctx.checkpoint["tables"], strict=True):
                table.load_state_dict({**table.state_dict(), **state})
            set_rng_state(ctx.checkpoint["rng"])

    def state() -> dict[str, Any]:
        return checkpoint_state(learner, ctx.recorder,
                                tables=[t.state_dict(items=False) for t in tables])

    try:
        while not ctx.recorder.done() and not ctx.stop.is_set():
            ctx.recorder.learner(learner.step())
            ctx.tick(state, learner)
        ctx.finish(state, learner)
    finally:
        if hasattr(dataset, "close"):
            dataset.close()

