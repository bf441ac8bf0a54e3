"""The ``distributed`` runtime: Acme's distributed agents (Hoffman et al. 2020, sections
2.4-2.5) as a program of Ray actors, from one laptop to a cluster, for every agent.

The program is built from the agent's builder alone (the nodes are in
:mod:`rlherd.runtime.program`): a **replay** node holds the agent's tables; a **learner** node
(an on-policy agent's holds its queue of whole rollouts instead, FIFO, each sampled once,
inserts blocking while it holds ``num_buffers``, so policy lag is bounded; such a program has no
replay node); ``num_actors`` **actor** nodes that act with parameters pulled from the learner
and write to replay (or the queue) in chunks; an **evaluator**
node (with ``--eval-every``) and a **counter**. This process, the driver, steps the learner in
half-second slices and in between does what every runtime does: counts, logs, checkpoints
(learner and replay together, so ``--resume`` restores both) and looks after the nodes.

Where it runs: with no address, an embedded Ray on this machine (no dashboard, quiet logs, actor
CPU requests scaled to fit) whose every service listens on loopback only, since Ray's API runs
the code of whoever reaches it; with ``--ray-address`` or ``RAY_ADDRESS``, an existing cluster
(``ray start --head`` on one machine, ``ray start --address HEAD:6379`` on the others), named in
one line on stderr (docs/guides/ray-cluster.md). Placement is by Ray's resource requests: the
learner asks for a CPU, a GPU with ``--device cuda``, and ``--learner-resources``, and the
replay, counter and evaluator nodes go where it goes (one placement group), so batches never
cross the network; each actor node asks for ``actor_cpus`` and ``--actor-resources``, e.g.
``{"actors": 1}`` for the machines started with ``ray start --resources '{"actors": 8}'``.

Faults (Launchpad's users' complaints): an actor node that dies is restarted, with a new seed,
said in one line on stderr and counted (``actor_restarts`` in summary.json); one whose code
raises stops the run with its traceback. A dead learner or replay node stops the whole program
with a message naming it; on every exit, Ctrl-C included, every node is stopped and an embedded
Ray shut down, and the driver waits until the nodes' processes are gone. ``nodes.json`` in the
run directory says where each node runs: its process id, its machine's address and its Ray
node's id. A lost machine is the same fault: its actor nodes restart on the machines left, and
the learner's is a dead learner.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import re
import signal
import sys
import threading
import time
from typing import Any

import numpy as np

from rlherd.envs.ids import child_env, environ
from rlherd.envs.vector import alive
from rlherd.errors import ConfigError, NodeDied, TrainingDiverged
from rlherd.run.rundir import atomic_write_json
from rlherd.runtime import RunContext, checkpoint_state, set_rng_state

try:
    import ray
    from ray._private import ray_constants
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as e:  # the runtime table imports this module only when it is chosen
    raise ConfigError("the distributed runtime needs Ray: pip install 'rlherd[ray]'") from e

from rlherd.replay.table import Table
from rlherd.runtime.node import CounterNode
from rlherd.runtime.program import (
    ActorNode,
    EvaluatorNode,
    LearnerNode,
    NodeSetup,
    ReplayNode,
    as_tensors,
    fetch_variables,
    rollout_signature,
)

TRAIN_SLICE_S = 0.5  # the driver steps the learner this long, then looks after the rest
READY_TIMEOUT_S = 180.0  # nodes not placed and started by then: the cluster cannot hold them
MAX_RESTARTS_PER_ACTOR = 20  # beyond this the fault is not transient: report it and stop
STOP_TIMEOUT_S = 10.0  # how long nodes get to leave, and their processes to be gone
FINAL_EVALUATION_S = 120.0  # the longest a finished run waits for its last evaluation


def run(ctx: RunContext) -> None:
    ray_kind = connect(ctx.settings)
    program = Program(ctx, cpu_requests(ctx.settings, ray_kind == "embedded"))
    try:
        program.launch()
        program.run()
    finally:
        pids = program.close()
        if ray_kind != "callers":
            ray.shutdown()  # stops an embedded Ray; leaves a cluster, which goes on
        wait_gone(pids)


def connect(settings: Any) -> str:
    """Join the cluster at ``ray_address`` (or ``RAY_ADDRESS``): "cluster"; or start Ray on this
    machine: "embedded"; or use the Ray the calling script started: "callers"."""
    if ray.is_initialized():
        return "callers"
    address = settings.ray_address or os.environ.get("RAY_ADDRESS", "")
    quiet = dict(logging_level="ERROR", log_to_driver=True)
    # ray.init makes SIGTERM exit at once; the run's own handler stops it with a checkpoint.
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        if address:
            ray.init(address=address, **quiet)
            given = "--ray-address" if settings.ray_address else "RAY_ADDRESS"
            print(f"rlherd: joined the Ray cluster at {ray.get_runtime_context().gcs_address} "
                  f"({given} {address})", file=sys.stderr, flush=True)  # fmt: skip
        else:
            start_embedded(quiet)
    except (ConnectionError, ValueError) as e:
        where = f"the Ray cluster at {address!r}" if address else "a local Ray"
        raise ConfigError(
            f"could not start or join {where}: {e}. Give the head's address (HOST:6379, or "
            "'auto' on a machine of the cluster) with --ray-address or RAY_ADDRESS."
        ) from None
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, sigterm)
    return "cluster" if address else "embedded"


def start_embedded(options: dict) -> None:
    """Start a new Ray on this machine (even if a `ray start` cluster runs here) whose every
    service (GCS, raylet, object manager, workers, agents, metrics, autoscaler monitor) listens
    on loopback only: Ray's API takes no credentials, so a port reachable from the network would
    run anyone's code during the run.

    Ray binds its services to the node's address, and to loopback alone when that address is
    loopback. It keeps a single machine on loopback in its single-machine mode (its default on
    macOS and Windows; ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` elsewhere); otherwise it replaces
    a loopback ``_node_ip_address`` by the machine's address. Ray reads that switch when it is
    imported, so it is set on Ray's constant while ``ray.init`` runs. A Ray that still chose
    another address is stopped: the run refuses to go on with its services exposed."""
    cluster_mode = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    # Its workers import what this process imports (a factory's module of the user's own): they
    # inherit the import path from the environment Ray starts in. (A runtime_env would pass it
    # too, but a job that has one gets none of the workers Ray starts ahead, and each node's
    # process waits on Ray's runtime-env agent.)
    try:
        with environ(**child_env()):
            ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=os.cpu_count() or 1,
                     include_dashboard=False, **options)  # fmt: skip
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = cluster_mode
    node_ip = ray.util.get_node_ip_address()
    if not ipaddress.ip_address(node_ip).is_loopback:
        ray.shutdown()
        raise RuntimeError(
            f"the embedded Ray {ray.__version__} listens on {node_ip}, not on loopback, so "
            "anyone who reaches this machine could run code in it; it was stopped. Run on a "
            "cluster of your own instead (docs/guides/ray-cluster.md)."
        )


def cpu_requests(settings: Any, embedded: bool) -> tuple[float, float]:
    """CPUs the learner node and each actor node ask for. On a cluster: one, and
    ``actor_cpus``. On an embedded Ray every node must fit this machine, so the learner keeps
    (up to) a whole CPU and the actors share the rest."""
    if not embedded:
        return 1.0, settings.actor_cpus
    cpus = float(os.cpu_count() or 1)
    learner = min(1.0, cpus / 2)
    return learner, min(settings.actor_cpus, (cpus - learner) / settings.num_actors)


def check(builder: Any, settings: Any) -> None:
    """Refuse, before anything starts, a layout the nodes could not run."""
    if builder.dataflow == "rollout":
        queue_capacity(builder, settings)


def queue_capacity(builder: Any, settings: Any) -> tuple[int, int]:
    """(rollouts per learner batch, rollouts the queue table holds)."""
    k = settings.envs_per_actor
    if builder.batch_size % k:
        raise ConfigError(
            f"distributed needs batch_size ({builder.batch_size}) to be a multiple of "
            f"envs_per_actor ({k}); e.g. --envs-per-actor {min(k, builder.batch_size)} with a "
            "batch_size that it divides"
        )
    per_batch = builder.batch_size // k
    capacity = settings.num_buffers or 2 * per_batch
    if capacity < per_batch:
        raise ConfigError(
            f"num_buffers={capacity} is too few: a learner batch takes {per_batch} rollouts of "
            f"{k} environments; set --num-buffers >= {per_batch} (or 0 for the default)"
        )
    if settings.rollouts_per_call > capacity:  # a call the queue never takes whole only lags
        raise ConfigError(
            f"rollouts_per_call={settings.rollouts_per_call} is more than the queue holds "
            f"({capacity} rollouts); set --rollouts-per-call <= {capacity} or raise --num-buffers"
        )
    return per_batch, capacity


def _queue_table(signature: dict, capacity: int) -> list[Table]:
    return [Table.queue("rollouts", signature, capacity)]


class Program:
    """The nodes of one run, launched on Ray and supervised from the driver."""

    def __init__(self, ctx: RunContext, cpus: tuple[float, float]):
        self.ctx = ctx
        self.learner_cpus, self.actor_cpus = cpus
        self.setup = NodeSetup(ctx.builder, ctx.spec, ctx.env_id, ctx.env_kwargs, ctx.settings,
                               ctx.seed)
        self.nodes: dict[str, Any] = {}  # name -> handle, every node ever started
        self.where: dict[str, dict] = {}  # name -> pid, ip
        self.actors: list[Any] = []
        self.runs: list[Any] = []  # each actor node's run() call
        self.restarts = 0
        self.evaluation: tuple[int, Any] | None = None  # (actor steps, the call) in flight
        self.last_info: tuple[float, list[dict]] | None = None
        self.last_actor_steps: dict[int, int] = {}
        self.per_actor: dict[int, int] = {}  # each actor node's steps, as the counter last said
        self.starting: dict[Any, str] = {}  # restarted nodes' ready() calls -> their names
        self.placement: Any = None  # the learner's placement group, once asked for

    # launching ---------------------------------------------------------------------------------
    def launch(self) -> None:
        ctx, builder, settings = self.ctx, self.ctx.builder, self.ctx.settings
        # Every actor may wait on a limiter, and poll and fetch from the learner, at once.
        threads = 2 * settings.num_actors + 8
        gpus = 1 if settings.device.startswith("cuda") else 0
        self.group = self._learner_group(gpus)
        self.counter = self._start("counter", CounterNode, self.group)
        learner_options = dict(self.group, max_concurrency=threads, num_cpus=self.learner_cpus,
                               num_gpus=gpus)  # fmt: skip
        if builder.dataflow == "replay":
            make_tables = functools.partial(builder.make_replay_tables, ctx.spec, True)
            self.replay = self._start("replay", ReplayNode,
                                      dict(self.group, max_concurrency=threads), make_tables)
            self.learner = self._start("learner", LearnerNode, learner_options, self.setup,
                                       self.replay, ctx.learner_budget)  # fmt: skip
        else:  # the queue of rollouts is the learner node's own
            per_batch, capacity = queue_capacity(builder, settings)
            signature = rollout_signature(builder, ctx.spec, settings.envs_per_actor)
            make_queue = functools.partial(_queue_table, signature, capacity)
            self.learner = self._start("learner", LearnerNode, learner_options, self.setup, None,
                                       ctx.learner_budget, per_batch, make_queue)  # fmt: skip
            self.replay = None
        self.evaluator = None
        if ctx.evaluator is not None:
            self._start_evaluator()
        # A resumed run's actors get fresh seeds, so they do not replay the first run's episodes.
        self.seed = ctx.seed + 7919 * int(ctx.recorder.counters["learner_steps"])
        self.actors = [None] * settings.num_actors
        for i in range(settings.num_actors):
            self._start_actor(i)
        # Every node's process starts (and imports torch) at once; the actors act only once the
        # learner holds the checkpoint's parameters.
        self._await_ready()
        if ctx.checkpoint is not None:
            with ctx.restoring():
                self._restore(self.learner.load_state_dict.remote(ctx.checkpoint["learner"]))
                if ctx.checkpoint.get("tables"):
                    self._restore(self.replay.load_state_dicts.remote(ctx.checkpoint["tables"]))
                    for state in ctx.checkpoint["tables"]:  # the replay node has them now
                        state.clear()  # (see load_tables)
                set_rng_state(ctx.checkpoint["rng"])
        self.runs = [actor.run.remote() for actor in self.actors]

    def _learner_group(self, gpus: int) -> dict:
        """Options that place a node beside the learner: the learner, replay, counter and
        evaluator share one Ray placement group, on one Ray node that offers the learner's CPU
        (and GPU) and ``learner_resources``, so batches never cross the network. Raises a
        :class:`ConfigError` if the cluster has no such node within ``READY_TIMEOUT_S``."""
        bundle = dict(self.ctx.settings.learner_resources, CPU=self.learner_cpus)
        if gpus:
            bundle["GPU"] = gpus
        self.placement = placement_group([bundle])
        if not ray.wait([self.placement.ready()], timeout=READY_TIMEOUT_S)[0]:
            raise ConfigError(
                f"no Ray node could take the learner within {READY_TIMEOUT_S:.0f}s: it asks for "
                f"{bundle}, and the cluster has {ray.cluster_resources()}. Start a node that "
                "offers them (ray start --resources '{...}'), or change --learner-resources "
                "(or --device)."
            )
        return dict(scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement, 0))

    def _start(self, name: str, cls: type, options: dict, *args: Any) -> Any:
        options = dict(dict(num_cpus=0, max_restarts=0), **options)
        handle = ray.remote(cls).options(**options).remote(*args)
        self.nodes[name] = handle
        return handle

    def _start_evaluator(self) -> None:
        play = self.ctx.evaluator.play
        self.evaluator = self._start("evaluator", EvaluatorNode, self.group, self.setup,
                                     play.episodes, play.seed, self.learner)  # fmt: skip

    def _start_actor(self, i: int) -> None:
        seed = self.seed + 1000 * i + 100_003 * self.restarts
        name = f"actor-{i}"
        options = dict(num_cpus=self.actor_cpus, max_concurrency=2,
                       resources=self.ctx.settings.actor_resources)  # fmt: skip
        self.actors[i] = self._start(name, ActorNode, options, i, seed, self.setup, self.replay,
                                     self.learner, self.counter)  # fmt: skip

    def _await_ready(self) -> None:
        """Wait until every node runs, recording where (``nodes.json``). A node whose
        constructor raised is that error as soon as it is known; a cluster that cannot place
        them all in ``READY_TIMEOUT_S`` is an error naming the late ones and what they ask for."""
        calls = {handle.ready.remote(): name for name, handle in self.nodes.items()}
        deadline, pending = time.monotonic() + READY_TIMEOUT_S, list(calls)
        try:
            while pending:
                done, pending = ray.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
                if not done:
                    break
                self.where[calls[done[0]]] = self._get(done[0])
        finally:
            atomic_write_json(self.ctx.recorder.rundir.path / "nodes.json", self.where)
        if pending:
            late = [calls[r] for r in pending]
            actors = (f"; actor nodes ask for {self.actor_cpus:.3g} CPU each and "
                      f"{self.ctx.settings.actor_resources or 'no'} other resources. Lower "
                      "--num-actors or --actor-cpus, change --actor-resources, or add machines"
                      if any(name.startswith("actor-") for name in late) else "")  # fmt: skip
            raise ConfigError(f"Ray did not start these nodes within {READY_TIMEOUT_S:.0f}s: "
                              f"{', '.join(late)}. The cluster has {ray.cluster_resources()}"
                              f"{actors}.")  # fmt: skip

    # the driver's loop -------------------------------------------------------------------------
    def run(self) -> None:
        ctx, recorder = self.ctx, self.ctx.recorder
        self._log_nodes(force=True)
        while not recorder.done() and not ctx.stop.is_set():
            steps, metrics = self._get(self.learner.train.remote(TRAIN_SLICE_S))
            self._take_counts()
            if steps:
                recorder.learner(metrics, steps)
            self._look_after_actors()
            self._evaluate()
            self._log_nodes()
            if ctx.snapshots is not None:  # a self-play run's past selves, to disk
                ctx.snapshots.maybe_save(self)
            ctx.tick(self.state)
        self._log_nodes(force=True)
        ctx.write_checkpoint(self.state)
        if not ctx.stop.is_set():  # stopped by a signal: leave now
            self._evaluate(final=True)

    def get_variables(self, names: list[str]) -> list[dict[str, Any]]:
        """The learner node's parameters now (a variable source for the run's snapshots)."""
        call = self.learner.get_variables.remote(names)
        self._get(call)  # a dead learner said plainly
        return fetch_variables(call)[1]

    def state(self) -> dict[str, Any]:
        """The learner's and (if ``checkpoint_replay``) the replay node's state, taken between
        two learner slices."""
        tables = None
        if self.ctx.builder.dataflow == "replay" and self.ctx.settings.checkpoint_replay:
            tables = self._get(self.replay.state_dicts.remote())
        learner = self._get(self.learner.state_dict.remote())
        return checkpoint_state(learner, self.ctx.recorder, tables=tables)

    def _take_counts(self) -> None:
        steps, agent_steps, (returns, lengths, policies), per_actor = self._get(
            self.counter.take.remote())  # fmt: skip
        self.ctx.recorder.add_actor_steps(steps, agent_steps)
        if returns:
            self.ctx.recorder.episodes(np.asarray(returns), np.asarray(lengths), policies)
        self.per_actor = per_actor

    def _look_after_actors(self) -> None:
        """Restart actor nodes whose process died; an actor whose code raised stops the run."""
        finished, _ = ray.wait(list(self.runs), num_returns=len(self.runs), timeout=0)
        for ref in finished:
            i = self.runs.index(ref)
            try:
                ray.get(ref)
                raise RuntimeError(f"actor node {i} stopped without being told to")
            except RayTaskError as e:  # its code raised (first: some of these are also
                self._raise_if_a_core_node_died()  # RayActorErrors, for a node it called)
                if isinstance(e.cause, ConfigError):
                    raise e.cause from None  # e.g. an extra missing on the actor's machine
                raise RuntimeError(f"actor node {i} failed; its traceback:\n{e}") from None
            except RayActorError as e:  # its process is gone (killed, out of memory, its
                died = death_reason(e)  # machine left): restart it
            self.restarts += 1
            limit = MAX_RESTARTS_PER_ACTOR * len(self.runs)
            if self.restarts > limit:
                raise RuntimeError(f"actor nodes died {self.restarts} times; see the log above")
            print(f"rlherd: actor node {i} died ({died}); restarted ({self.restarts} of at most "
                  f"{limit} restarts)", file=sys.stderr, flush=True)  # fmt: skip
            with contextlib.suppress(Exception):
                ray.kill(self.actors[i], no_restart=True)
            self._start_actor(i)  # not waited for: the program goes on meanwhile
            self.runs[i] = self.actors[i].run.remote()
            self.starting[self.actors[i].ready.remote()] = f"actor-{i}"
        self._note_started(timeout=0)
        self.ctx.recorder.set_run_count("actor_restarts", self.restarts)

    def _note_started(self, timeout: float) -> None:
        """Record where restarted nodes run (nodes.json), once they do."""
        if not self.starting:
            return
        done, _ = ray.wait(list(self.starting), num_returns=len(self.starting), timeout=timeout)
        for ref in done:
            name = self.starting.pop(ref)
            with contextlib.suppress(RayActorError, RayTaskError):  # died again: seen later
                self.where[name] = ray.get(ref)
        if done:
            atomic_write_json(self.ctx.recorder.rundir.path / "nodes.json", self.where)

    def _evaluate(self, final: bool = False) -> None:
        """Start an evaluation on the evaluator node when one is due (one at a time, while
        training goes on); log it once it is back (at the end: wait up to
        ``FINAL_EVALUATION_S`` for it, then evaluate the final policy if none reached the
        budget). An evaluator node that died is restarted."""
        if self.evaluator is None:
            return
        if self.evaluation is not None:
            steps, call = self.evaluation
            if ray.wait([call], timeout=FINAL_EVALUATION_S if final else 0)[0]:
                self.evaluation = None
                try:
                    self.ctx.evaluator.log(steps, ray.get(call), self._evaluated_policy)
                except RayActorError:
                    if final:
                        return
                    ray.kill(self.evaluator, no_restart=True)
                    self._start_evaluator()
        if self.evaluation is None:
            steps = self.ctx.evaluator.due(end=final)
            if steps is not None:
                self.evaluation = (steps, self.evaluator.evaluate.remote())
                if final:  # the final policy's (see Evaluator.due)
                    self._evaluate(final=True)

    def _evaluated_policy(self) -> dict[str, Any]:
        """The parameters the evaluator node played with in its latest evaluation."""
        return as_tensors([self._get(self.evaluator.evaluated_policy.remote())])[0]

    def _log_nodes(self, force: bool = False) -> None:
        """``metrics/replay.csv`` (per table: size, inserts and samples per second) and
        ``metrics/actors.csv`` (per actor node: steps per second), every ``log_interval_s``."""
        now = time.monotonic()
        if not force and now - self.last_info[0] < self.ctx.settings.log_interval_s:
            return
        host = self.learner if self.replay is None else self.replay  # where the tables are
        info = self._get(host.info.remote())
        steps = int(self.ctx.recorder.counters["actor_steps"])
        rundir = self.ctx.recorder.rundir
        before = self.last_info
        for j, table in enumerate(info):
            row = dict(actor_steps=steps, **table)
            if before is not None:
                dt = now - before[0]
                row["inserts_per_s"] = round((table["inserts"] - before[1][j]["inserts"]) / dt, 1)
                row["samples_per_s"] = round((table["samples"] - before[1][j]["samples"]) / dt, 1)
            rundir.log("replay", row, step=steps)
        per_actor = self.per_actor
        if before is not None:
            for i, total in sorted(per_actor.items()):
                rate = (total - self.last_actor_steps.get(i, 0)) / (now - before[0])
                rundir.log("actors", dict(actor_steps=steps, actor=i, steps=total,
                                          steps_per_s=round(rate, 1)), step=steps)  # fmt: skip
        self.last_info, self.last_actor_steps = (now, info), dict(per_actor)

    # faults and the end --------------------------------------------------------------------------
    def _get(self, ref: Any) -> Any:
        """``ray.get``, with a failure of a node the program needs said plainly."""
        try:
            return ray.get(ref)
        except (RayActorError, RayTaskError) as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, ConfigError | TrainingDiverged):
                raise cause from None  # said as every runtime says it
            self._raise_if_a_core_node_died()
            raise  # a bug: Ray's error carries the node's traceback

    def _restore(self, ref: Any) -> None:
        """Wait for a node to restore its part of the checkpoint; what a part that does not fit
        raised there is raised here as it was, for ``ctx.restoring()`` to say in one line as
        every runtime does (any other error keeps Ray's, which carries the node's traceback)."""
        try:
            self._get(ref)
        except RayTaskError as e:
            if not isinstance(e.cause, KeyError | TypeError | ValueError | IndexError |
                              RuntimeError):  # fmt: skip
                raise
            raise e.cause from None

    def _raise_if_a_core_node_died(self) -> None:
        """Raise :class:`NodeDied` if the learner, replay or counter node is gone (one that has
        not said it is ready yet may still be starting: it is not asked)."""
        for name in ("learner", "replay", "counter"):
            if name not in self.where:
                continue
            try:
                ray.get(self.nodes[name].ready.remote(), timeout=STOP_TIMEOUT_S)
            except (RayActorError, GetTimeoutError):
                raise NodeDied(
                    f"the {name} node died, so the program was stopped (every node is stopped "
                    f"before this returns). Continue from the last checkpoint with "
                    f"`rlherd train --resume {self.ctx.recorder.rundir.path}`."
                ) from None

    def close(self) -> list[int]:
        """Stop every node: actors leave their loop (their writes give up at once), then every
        node is killed. Returns the process ids of the nodes on this machine."""
        here = ray.util.get_node_ip_address()
        for actor in self.actors:
            with contextlib.suppress(Exception):
                actor.stop.remote()
        runs = [r for r in self.runs if r is not None]
        if runs:
            ray.wait(runs, num_returns=len(runs), timeout=STOP_TIMEOUT_S / 2)
        self._note_started(timeout=STOP_TIMEOUT_S / 2)  # so their processes are waited for
        for handle in self.nodes.values():
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
        if self.placement is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.placement)
        return [w["pid"] for w in self.where.values() if w["ip"] == here]


def death_reason(error: Any) -> str:
    """Why Ray says an actor died, in one line. Its report is a header, the actor's fields (each
    on a tab-indented line), then paragraphs of causes; this keeps the first sentence after the
    fields and the worker's exit detail, where it has one."""
    lines = str(error).splitlines()
    said = next((line for line in lines[1:] if line.strip() and not line.startswith("\t")),
                lines[0] if lines else "Ray gave no reason")  # fmt: skip
    reason = said.split(". ")[0].strip().rstrip(".")
    detail = re.search(r"Worker exit detail: (.+?)\.(?: |$)", said)
    return f"{reason}; {detail.group(1)}" if detail else reason


def wait_gone(pids: list[int]) -> None:
    """Wait (up to ``STOP_TIMEOUT_S``) until these processes have exited."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if alive(pid)]
        time.sleep(0.05)
