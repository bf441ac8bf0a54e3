"""Runtimes decide where an agent's pieces run; the agent code is the same in each.

A runtime declares itself in one :class:`Runtime`: its name, the module that runs it, its
settings (a dataclass that checks itself) and the capabilities it provides. An agent's builder
declares the capabilities it needs (``needs``), and runs on every runtime that provides them:
no agent names a runtime and no command branches on one. :data:`RUNTIMES` holds rlherd's own
(:data:`OWN`) and those installed packages add through the ``rlherd.runtimes`` entry point
group (:mod:`rlherd.registry`). Each module has ``run(ctx: RunContext)`` and reaches the agent
only through ``ctx.builder``; no runtime module imports an agent.

- ``single``: one process steps a batch of environments, acting and learning in turn.
- ``mono``: MonoBeast; actor processes act with shared-memory parameters, filling shared-memory
  rollout slots (on-policy) or inserting into the learner's replay tables (replay).
- ``poly``: PolyBeast; environment servers over gRPC, actor threads, dynamic batching of
  inference on the learner's device.
- ``distributed``: Acme's distributed programs on Ray; replay, learner, actors, evaluator and
  counter are Ray actors, on an embedded local Ray or an existing cluster.
- ``device``: WarpDrive; environments, sampling, rollouts and learning on one torch device.
- ``offline``: Acme's offline agents; a learner reads a fixed dataset (``--dataset``), and only
  the evaluator steps an environment.

This module imports no torch, numpy or environment: the CLI reads :data:`RUNTIMES` (names and
settings) to build ``rlherd train --help`` at once. The helpers below that need them import
them when called, by which time a run has loaded them anyway.
"""

from __future__ import annotations

import contextlib
import importlib
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlherd import registry
from rlherd.errors import ConfigError, TrainingDiverged
from rlherd.runtime import settings as s

if TYPE_CHECKING:
    import gymnasium as gym

    from rlherd.core import EnvSpec

# What a runtime may provide, and so what a builder may need (``AgentBuilder.needs``).
CAPABILITIES: dict[str, str] = {
    "rollout": "runs on-policy agents: learner batches of whole rollouts of the current policy",
    "replay": "runs replay agents: replay tables between the actors and the learner",
    "acting": "the learner learns from what the run's own actors do",
    "actor_network": "each actor acts with its own copy of the network in its own process (an "
                     "agent may search with it), not through a shared inference server",
    "dataset": "the learner learns from a fixed dataset (--dataset)",
    "gym_envs": "it makes Gymnasium environments from the run's environment id",
    "multi_agent": "it steps PettingZoo games, every agent a row (rlherd.envs.pettingzoo)",
    "self_play": "its actors play turn-based games against their policy's past selves "
                 "(rlherd.envs.turns)",
}  # fmt: skip
DATAFLOWS = ("replay", "rollout")  # the capabilities that are a builder's dataflow


@dataclass(frozen=True)
class Runtime:
    """A runtime's declaration. Its ``module`` has ``run(ctx: RunContext)``, and may have
    ``check(builder, settings)`` (refuse, before anything is made, an agent it cannot run), and
    where it makes no Gymnasium environments (no ``gym_envs``), ``spec(record)`` (check the
    :class:`~rlherd.run.rundir.RunRecord`'s environment; the spec, or None) and
    ``evaluate(record, builder, checkpoint, source, episodes, video, greedy, seed)`` (``rlherd
    eval`` of its runs; ``source``, the checkpoint's file, names it where it does not fit)."""

    name: str
    module: str
    settings: type  # a dataclass of rlherd.runtime.settings.Common's kind
    provides: frozenset[str]  # keys of CAPABILITIES
    why_not: str = ""  # said when an agent's dataflow is not among those it provides
    counts: str = "actor_steps"  # what --total-steps counts (and progress, evaluations, logs)

    def __post_init__(self) -> None:
        unknown = sorted(self.provides - set(CAPABILITIES))
        if unknown:
            raise ValueError(f"runtime {self.name!r} provides unknown capabilities {unknown}; "
                             f"known: {', '.join(CAPABILITIES)}")  # fmt: skip

    @property
    def dataflows(self) -> tuple[str, ...]:
        return tuple(d for d in DATAFLOWS if d in self.provides)

    def hook(self, name: str) -> Callable | None:
        """The module's function ``name`` (``run``, ``check``, ``evaluate``), if it has one."""
        return getattr(importlib.import_module(self.module), name, None)

    def run(self, ctx: RunContext) -> None:
        self.hook("run")(ctx)

    def check(self, builder: Any, settings: Any) -> None:
        check = self.hook("check")
        if check is not None:
            check(builder, settings)


HOST = frozenset({"rollout", "replay", "acting", "actor_network", "gym_envs", "multi_agent",
                  "self_play"})  # fmt: skip
OWN: dict[str, Runtime] = {
    r.name: r
    for r in (
        Runtime("single", "rlherd.runtime.single", s.Single, HOST),
        Runtime("mono", "rlherd.runtime.mono", s.Mono, HOST),
        Runtime("poly", "rlherd.runtime.poly", s.Poly, HOST - {"actor_network", "self_play"}),
        Runtime("distributed", "rlherd.runtime.distributed", s.Distributed, HOST),
        Runtime(
            "device",
            "rlherd.runtime.device",
            s.Device,
            frozenset({"rollout", "acting"}),
            "it keeps whole rollouts on the device and has no replay tables",
        ),
        Runtime(
            "offline",
            "rlherd.runtime.offline",
            s.Offline,
            frozenset({"replay", "dataset", "gym_envs"}),
            "it learns from a fixed dataset of transitions, and an on-policy agent learns from "
            "rollouts of its current policy",
            counts="learner_steps",
        ),
    )
}

RUNTIMES: dict[str, Runtime]  # made by __getattr__ on first use, then an ordinary attribute


def __getattr__(name: str) -> Any:
    if name == "RUNTIMES":
        paths = registry.table(registry.RUNTIME_GROUP, {n: "" for n in OWN})
        runtimes = registry.load_each(paths, OWN, _not_a_runtime)
        globals()["RUNTIMES"] = runtimes
        return runtimes
    raise AttributeError(f"module 'rlherd.runtime' has no attribute {name!r}")


def _not_a_runtime(name: str, found: Any) -> str | None:
    if not isinstance(found, Runtime):
        return f"it is a {type(found).__name__}, not a rlherd.runtime.Runtime"
    if found.name != name:
        return f"the runtime it holds is named {found.name!r}"
    return None


def runtimes_for(needs: frozenset[str]) -> list[str]:
    """The runtimes that provide all of ``needs``, in the registry's order."""
    runtimes = globals().get("RUNTIMES") or __getattr__("RUNTIMES")
    return [name for name, r in runtimes.items() if needs <= r.provides]


@dataclass
class RunContext:
    """Everything a runtime gets: the agent's builder, the environment, the runtime's settings,
    the run's recorder and checkpoint, and the stop signal."""

    builder: Any  # a rlherd.core.ReplayBuilder or RolloutBuilder
    env_id: str
    env_kwargs: dict[str, Any]
    spec: EnvSpec | None  # None on the device runtime, which asks its device environment
    settings: Any  # the runtime's settings dataclass (Runtime.settings)
    recorder: Any  # rlherd.run.recorder.Recorder
    seed: int
    checkpoint: dict[str, Any] | None  # to resume from
    save: Callable[[dict[str, Any]], Path]  # writes a checkpoint (runtimes call write_checkpoint())
    stop: threading.Event  # set by SIGINT / SIGTERM: stop at the next safe point
    evaluator: Any = None  # rlherd.run.evaluation.Evaluator, or None
    snapshots: Any = None  # rlherd.run.evaluation.Snapshots (self-play), or None
    checkpoint_file: Path | None = None  # the file ``checkpoint`` was read from

    def restoring(self) -> contextlib.AbstractContextManager[None]:
        """Where a runtime restores its parts from ``checkpoint``: one that does not fit them
        is one line naming the file (:func:`rlherd.run.rundir.fitting`)."""
        from rlherd.run.rundir import fitting

        return fitting(self.checkpoint_file)

    def tick(self, state: Callable[[], dict[str, Any]], source: Any = None) -> None:
        """What every runtime does between learner steps: evaluate with ``source``'s parameters
        when an evaluation is due (and keep a self-play run's snapshot when one is), log, and
        checkpoint ``state()`` when a checkpoint is due."""
        if source is not None and self.evaluator is not None:
            self.evaluator.maybe_run(source)
        if source is not None and self.snapshots is not None:
            self.snapshots.maybe_save(source)
        if self.recorder.tick():
            self.write_checkpoint(state)

    def finish(self, state: Callable[[], dict[str, Any]], source: Any) -> None:
        """The run's end: unless the run was stopped, the final policy is evaluated with
        ``source``'s parameters where no evaluation reached the budget yet (one due there whose
        step actors in other threads or processes crossed after the last tick read the
        counters, or a budget that is no multiple of ``eval_every``); then the final
        checkpoint."""
        if self.evaluator is not None and not self.stop.is_set():
            self.evaluator.maybe_run(source, end=True)
        self.write_checkpoint(state)

    def write_checkpoint(self, state: Callable[[], dict[str, Any]]) -> None:
        """Write ``state()`` as a checkpoint; the recorder hears how long gathering and writing
        it took (it keeps checkpoints to a small share of the run, and the summary with them).
        The learner's metrics are written first, so ``learner.csv`` reaches the checkpoint and a
        non-finite metric stops the run before it."""
        self.recorder.write_learner_row()
        start = time.monotonic()
        path = self.save(state())
        self.recorder.checkpointed(path, time.monotonic() - start)

    @property
    def learner_budget(self) -> int:
        """The run's budget in what learners count, the rows they learn from: ``total_steps``,
        times a multi-agent game's agents (its runs count environment steps), so that the
        learners' schedules (learning-rate decay, annealing) span the whole run."""
        return self.recorder.total_steps * (self.spec.agents if self.spec is not None else 1)

    def _bsuite_results(self) -> Path | None:
        """Where a bsuite id's training environment writes bsuite's CSV: the run's ``bsuite/``
        folder, as it is now (:mod:`rlherd.envs.bsuite`); None for any other id."""
        from rlherd import envs as rl_envs
        from rlherd.envs.bsuite import RESULTS

        if rl_envs.family(self.env_id) != "bsuite":
            return None
        return self.recorder.rundir.path.resolve() / RESULTS

    def make_envs(self, num_envs: int, workers: int = 0) -> gym.vector.VectorEnv:
        """The run's training environments; a bsuite id's logs bsuite's CSV (the train command
        allows it one)."""
        kwargs, results = self.env_kwargs, self._bsuite_results()
        if results is not None:
            kwargs = dict(kwargs, results_dir=str(results), overwrite=self.checkpoint is not None)
        return make_envs(self.env_id, kwargs, self.settings, num_envs, workers)

    def resumed_envs(self, envs: gym.vector.VectorEnv, restored: bool) -> None:
        """A resumed run's environments: ``restored`` where they go on where they were (from
        their snapshot, or fresh with their plain-data progress), else fresh. A bsuite id's CSV
        is one stream of its episodes, which fresh environments without their progress would
        start again at episode 1 under a run that goes on counting. Its logger writes to the
        run's folder as it is now (moved, or named from another working directory)."""
        results = self._bsuite_results()
        if results is None:
            return
        if not restored:
            raise ConfigError(
                f"{self.recorder.rundir.path} continues bsuite's CSV only with its environment "
                "snapshot or bsuite's counts, and its checkpoint holds neither that this machine "
                "can load: delete the run directory and train the id again (a sweep then starts "
                "it anew)"
            )
        for env in envs.envs:
            env.unwrapped.log_to(results)


def make_envs(
    env_id: str, env_kwargs: dict[str, Any], settings: Any, num_envs: int, workers: int = 0
) -> gym.vector.VectorEnv:
    """``num_envs`` environments as the runtime's settings say (ale-py's native vector env for
    Atari unless ``native_vector_env`` is off; BatchEnv processes when ``workers`` > 0)."""
    from rlherd import envs as rl_envs

    native = getattr(settings, "native_vector_env", True)
    # Each actor's pool counts its own steps: every actor snapshots at the run's pace.
    every = max(1, settings.opponent_every // getattr(settings, "num_actors", 1))
    selfplay = dict(every=every, latest=settings.opponent_latest, size=settings.opponent_pool)
    return rl_envs.make_vector(env_id, num_envs, native=native, workers=workers,
                               selfplay=selfplay, agent_index=settings.agent_index,
                               **env_kwargs)  # fmt: skip


class GracefulStop:
    """Turns the first SIGINT / SIGTERM / SIGHUP into a request to stop at the next safe point (so
    the run can write its final checkpoint); a second SIGINT interrupts at once. SIGHUP is a
    closed terminal's, and the kernel's to a stopped seed whose group has died."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum = 0  # the signal received, if any (the event is also how runtimes stop)
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if self.event.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        self.event.set()

    def __enter__(self) -> threading.Event:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self.event

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def checkpoint_state(learner, recorder, **parts: Any) -> dict[str, Any]:
    """What every runtime checkpoints (the learner's state, counters, global RNGs) plus its own
    ``parts``; a learner (or a learner's state dict) holding non-finite values, or parameters
    that blew up since its last divergence check, is never checkpointed."""
    check = getattr(learner, "check_divergence", None)  # a NetworkLearner's
    if check is not None:
        check()
    state = learner if isinstance(learner, dict) else learner.state_dict()
    _check_finite(state, "learner")
    return dict(learner=state, recorder=recorder.state_dict(), rng=rng_state(), **parts)


def _check_finite(value: Any, where: str) -> None:
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and not torch.isfinite(value).all():
            raise TrainingDiverged(f"{where} is not finite; {TrainingDiverged.HINT}")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{where}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_finite(v, f"{where}[{i}]")


def say(message: str) -> None:
    """One line on stderr, as it happens, for a fault the run survives (an actor replaced, a
    server out and back): counts in summary.json tell the total afterwards, not the moment."""
    print(f"rlherd: {message}", file=sys.stderr, flush=True)


def with_demonstrations(ctx: Any, dataset: Any, tables: list, seed: int) -> tuple[Any, list]:
    """The learner's dataset and the tables to checkpoint, with the run's demonstrations mixed
    in (``--demonstrations``; :mod:`rlherd.replay.demonstrations`) in the learner's process:
    a ``MixedDataset``, and the demonstrations' table after the agent's own. ``ctx`` is a
    :class:`RunContext` or a distributed node's setup (its builder, spec, env and settings)."""
    source = getattr(ctx.settings, "demonstrations", "")
    if not source or ctx.builder.dataflow != "replay":
        return dataset, tables
    from rlherd.replay import demonstrations

    episodes = demonstrations.load(source, ctx.spec, ctx.env_id, ctx.env_kwargs, seed)
    table = demonstrations.make_table(ctx.builder, ctx.spec, episodes)
    theirs = ctx.builder.make_dataset([table], ctx.settings.device)
    ratio = ctx.settings.demonstration_ratio
    return demonstrations.MixedDataset(dataset, theirs, ratio), [*tables, table]


def table_states(tables: list, settings: Any) -> list | None:
    """The replay tables' states for a checkpoint, unless ``checkpoint_replay`` is off."""
    if not tables or not settings.checkpoint_replay:
        return None
    return [t.state_dict() for t in tables]


def load_tables(tables: list, states: list | None) -> None:
    """Restore tables from a checkpoint (which may hold none: ``checkpoint_replay`` was off),
    then empty each state: the table holds its own copy now, and the checkpoint, which the
    run's context holds until the run ends, would keep a second copy of the replay alive for
    the whole run (a resumed size-50 deep sea R2D2 run, an 8 GB table, was killed for memory at
    its next checkpoint on a 24 GB machine)."""
    for table, state in zip(tables, states or [], strict=False):
        table.load_state_dict(state)
        state.clear()


def rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return dict(torch=torch.get_rng_state(), cuda=cuda, numpy=np.random.get_state(),
                python=random.getstate())  # fmt: skip


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def torch_threads(n: int) -> None:
    """Give this process ``n`` intra-op threads and flush subnormal floats to zero in the
    calling thread (threads it starts later inherit the flag; threads started before it, such
    as Ray's, do not, so a learner running on one sets the flag there too).

    Why the flush: a weight that stops getting gradient (a dead ReLU unit) has its Adam first
    moment decay by 0.9 per step through the subnormal range below 1.2e-38, where x86 arithmetic
    takes a slow path. On RL Zoo's CartPole DQN network a third of Adam's state sat there after
    1,500 updates, and a whole run took 1.34x longer than with the flush, for the same returns.
    Values that small change nothing a network computes."""
    import torch

    torch.set_num_threads(n)
    torch.set_flush_denormal(True)
