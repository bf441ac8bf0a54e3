"""The ``mono`` runtime: MonoBeast (Küttler et al. 2019, section 5.1), for every agent.

``num_actors`` processes each run the agent's own actor in an environment loop over
``envs_per_actor`` environments, acting with a CPU copy of the networks that they fetch (through
a :class:`SharedVariables` source) from shared memory, which the learner overwrites after every
step. What actors produce reaches the learner's process by dataflow:

- on-policy: rollouts are written straight into ``num_buffers`` shared-memory slots; only slot
  indices travel, so no rollout is ever pickled. The learner's dataset joins
  ``batch_size / envs_per_actor`` full slots into a batch and hands them back.
- replay: the actor's adder writes into :class:`RemoteTable` proxies, which send each loop
  step's items in one message to the learner's tables; the actor waits for the insert, so the
  tables' rate limiters hold across processes (actors wait for the learner, and it for them).

Each actor talks over a private pipe served by one thread here (shared ``multiprocessing.Queue``s
deadlock every actor when one is killed while holding the queue's lock; a private pipe breaks
alone). Actors run at a lower priority (``actor_nice``), so where processes outnumber cores the
learner is not the one kept waiting. Faults: an actor that dies is restarted (its slot
recovered, the restart counted, and said on stderr as it happens); one that fails before acting
stops the run with its traceback. A forked actor is watched through its own process (a pidfd),
not through the fork server that started it, whose death is not the actors'.
SIGINT / SIGTERM stop the run at the next learner step with a final checkpoint; actors die with
the learner (``die_with_parent``).
A resumed run continues the learner exactly; actors start new episodes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import resource
import signal
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass
from multiprocessing import forkserver, reduction
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

from rlherd.envs.ids import child_env, environ
from rlherd.envs.vector import die_with_parent
from rlherd.errors import ConfigError, exit_status
from rlherd.replay.rollouts import RolloutWriter, allocate_rollout, join, rollout_layout
from rlherd.run.counting import StepReport
from rlherd.run.loop import EnvironmentLoop
from rlherd.runtime import (
    RunContext,
    checkpoint_state,
    load_tables,
    make_envs,
    say,
    set_rng_state,
    table_states,
    torch_threads,
    with_demonstrations,
)

POLL_S = 0.5  # how often a waiting learner wakes to check for stop and dead actors
STATS_PERIOD_S = 0.2  # actors report steps and episodes at most this often
MAX_RESTARTS_PER_ACTOR = 20  # beyond this the fault is not transient: report it and stop
FORKED = sys.platform.startswith("linux")  # actors fork from a fork server (actor_context)


class SharedVariables:
    """A :class:`~rlherd.core.VariableSource` in shared memory: the learner publishes a copy of
    its networks' state after every step and bumps ``version``; actors copy it when it moved."""

    def __init__(self, module: torch.nn.Module):
        self.module = module.share_memory()
        self.version = torch.zeros(1, dtype=torch.int64).share_memory_()

    def publish(self, state: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict(state)
        self.version += 1

    def variables_version(self) -> int:
        return int(self.version[0])

    def get_variables(self, names: list[str]) -> list[dict[str, Any]]:
        return [self.module.state_dict() for _ in names]


class RemoteTable:
    """The actor's side of a learner's table: items wait here until :meth:`flush` sends them
    in one message and waits until the learner's table took them (its rate limiter's say)."""

    def __init__(self, index: int, channel: Channel, signature: dict):
        self.index, self.channel, self.signature = index, channel, signature
        self.items: list[tuple[dict, float]] = []

    def insert(self, item: dict, priority: float = 1.0, timeout: float | None = None) -> None:
        self.items.append((item, priority))

    def flush(self) -> None:
        if self.items:
            self.channel.request(("insert", self.index, self.items))
            self.items = []


class Channel(StepReport):
    """An actor process's pipe to the learner: requests (answered), and step / episode counts
    sent at most every ``STATS_PERIOD_S`` (the environment loop's recorder)."""

    def __init__(self, conn: Connection):
        super().__init__(STATS_PERIOD_S)
        self.conn = conn

    def request(self, message: tuple) -> Any:
        self.conn.send(message)
        return self.conn.recv()

    def send(self, steps: int, agent_steps: int, episodes: tuple[list, list, list | None]) -> None:
        self.conn.send(("stats", steps, agent_steps, episodes))


@dataclass
class ActorSetup:
    """What an actor process is given over its pipe (it must pickle: no recorder, no open
    files). Not as the process's argument: a forked process gets its arguments' shared-memory
    tensors as file descriptors in one message, at most 252, which 32 IMPALA slots pass. Over
    the pipe each is a descriptor lent until the actor took it, so the learner raises its limit
    of open files (:func:`open_files_limit`)."""

    builder: Any
    spec: Any
    env_id: str
    env_kwargs: dict
    settings: Any
    source: SharedVariables
    slots: list[dict] | None  # on-policy: the shared-memory rollout slots
    signatures: list[dict]  # replay: the learner's tables' (adders may read them)


def actor_process(seed: int, conn: Connection, stop: Any, budget: Budget, forked: bool) -> None:
    """Run the agent's actor in an environment loop until ``stop`` (an Event) is set; idle once
    the actors have taken the run's ``budget`` of steps."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's to handle
    try:
        if forked:
            _take_the_runs_process_state(conn)
        setup: ActorSetup = conn.recv()
        torch_threads(1)
        os.nice(setup.settings.actor_nice)  # threads started from here on (ALE's) inherit it
        builder, k, slots = setup.builder, setup.settings.envs_per_actor, setup.slots
        channel = Channel(conn)
        policy = builder.make_policy(builder.make_networks(setup.spec, "cpu"))
        tables: list[RemoteTable] = []
        if slots is None:
            tables = [RemoteTable(i, channel, s) for i, s in enumerate(setup.signatures)]
            adder = builder.make_adder(tables, k)
        else:
            first = channel.request(("slot", None, 0))
            hand_over = lambda full: _hand_over(full, slots, channel, setup.source)
            adder = RolloutWriter(slots[first], hand_over)
        actor = builder.make_actor(seed, policy, setup.spec, adder, setup.source)
        actor.update(wait=True)
        # Actors are daemon processes, which may not start processes of their own.
        envs = make_envs(setup.env_id, setup.env_kwargs, setup.settings, k, workers=0)
        loop = EnvironmentLoop(envs, actor, channel, seed)
        conn.send(("started",))
        while not stop.is_set():  # not stop.wait(): a waiter killed there blocks every set()
            if budget.spent():  # its last steps (its own or another's spent it), counted now
                channel.report(force=True)  # (nothing is sent when there are none)
                time.sleep(POLL_S)  # idle, not gone: an actor that left would be restarted
                continue
            budget.take(loop.step())
            for table in tables:
                table.flush()
            channel.report()
    except (KeyboardInterrupt, EOFError, BrokenPipeError, ConnectionResetError):
        pass  # stopped, or the learner is gone
    except ConfigError as e:  # the run's fault (a game it cannot step), not the process's
        conn.send(("error", str(e)))
    except Exception:
        traceback.print_exc()
        raise


@dataclass
class Budget:
    """The actor steps left to the run (its recorder's count, when the pool started) and the
    steps each actor has taken of them, in shared memory. No lock: an actor killed holding one
    would stop the others for good; each actor writes only its own count, and reads the sum."""

    steps: int
    taken: Any  # multiprocessing.Array of int64, one per actor
    index: int = 0  # the actor's own count

    def take(self, steps: int) -> None:
        self.taken[self.index] += steps

    def spent(self) -> bool:
        return sum(self.taken[:]) >= self.steps


def _take_the_runs_process_state(conn: Connection) -> None:
    """The run's environment, standard output and error in place of the fork server's (those
    of when it started, perhaps for an earlier run in this process), before the setup, whose
    unpickling may import a module of the user's or fail with a traceback."""
    os.environ.clear()
    os.environ.update(conn.recv())
    for fd in (1, 2):
        received = reduction.recv_handle(conn)
        os.dup2(received, fd)
        os.close(received)


def _hand_setup(conn: Connection, setup: ActorSetup, pid: int, forked: bool) -> None:
    """What :func:`actor_process` takes from its pipe. An actor that died at once is left to
    :meth:`ActorPool.check`, which restarts it or says why it could not start."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if forked:
            conn.send(dict(os.environ))
            for fd in (1, 2):
                reduction.send_handle(conn, fd, pid)
        conn.send(setup)


def _hand_over(full, slots, channel: Channel, source) -> dict:
    """Give a full slot to the learner; continue in the free one it answers with."""
    index = next(i for i, s in enumerate(slots) if s is full)
    channel.report(force=True)  # the steps in the slot are counted before it is learned on
    return slots[channel.request(("slot", index, source.variables_version()))]


class ActorLink:
    """The learner's side of one actor: a thread serving its pipe."""

    def __init__(self, pool: ActorPool, index: int, seed: int):
        self.pool, self.index = pool, index
        parent, child = pool.mp.Pipe()
        self.conn = parent
        self.started = False
        # A ConfigError the actor met, or its inserts did (a replay table that measured its
        # compressed items and would not fit): the run stops with it.
        self.error: str | None = None
        self.held: int | None = None  # the slot the actor is filling
        budget = dataclasses.replace(pool.budget, index=index)
        self.process = pool.mp.Process(
            target=actor_process, args=(seed, child, pool.stop, budget, FORKED), daemon=True
        )
        self.process.start()
        child.close()  # only the actor holds its end, so its death reads as EOF here
        self.pidfd = _pidfd(self.process.pid) if FORKED else None
        if self.pidfd is not None:  # closed with the link, once no thread of it can read it
            weakref.finalize(self, os.close, self.pidfd)
        _hand_setup(parent, pool.setup, self.process.pid, FORKED)
        self.thread = threading.Thread(target=self._serve, name=f"actor-link-{index}", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        pool = self.pool
        try:
            while True:
                message = self.conn.recv()
                kind = message[0]
                if kind == "stats":
                    _, steps, agent_steps, (returns, lengths, policies) = message
                    pool.ctx.recorder.add_actor_steps(steps, agent_steps)
                    pool.reported[self.index] += steps
                    if returns:
                        pool.ctx.recorder.episodes(np.asarray(returns), np.asarray(lengths),
                                                   policies)  # fmt: skip
                    if pool.ctx.recorder.done():  # now, not once the learner looks (POLL_S)
                        pool.stop.set()
                elif kind == "insert":
                    _, table, items = message
                    for item, priority in items:
                        pool.insert(table, item, priority)
                    self.conn.send("ok")
                elif kind == "slot":
                    _, index, version = message
                    if index is not None:
                        self.held = None  # the learner's now, never to be freed again here
                        pool.full.put((index, version))
                    self.held = pool.free_slot(self)
                    self.conn.send(self.held)
                elif kind == "started":
                    self.started = True
                elif kind == "error":  # what restarting it would meet again
                    self.error = message[1]
        except (EOFError, OSError, _Stopped):
            pass  # the actor died (the pool restarts it) or the run is stopping
        except ConfigError as error:  # the link stops serving; check() stops the run
            self.error = str(error)

    def dead(self, timeout: float | None = 0.0) -> bool:
        """Whether the actor process has ended (waiting up to ``timeout`` seconds). Not
        ``is_alive()``: the main loop's check() and this link's thread may both ask."""
        sentinel = self.process.sentinel if self.pidfd is None else self.pidfd
        return bool(wait([sentinel], timeout))

    def end(self, timeout: float) -> None:
        """Give the actor ``timeout`` seconds to leave, then terminate it, then kill it."""
        if not self.dead(timeout):
            self.send(signal.SIGTERM)
            if not self.dead(2.0):
                self.send(signal.SIGKILL)
                self.dead(None)
        self.release()

    def send(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.pidfd is None:
                os.kill(self.process.pid, signum)
            else:  # the process itself, never another that took its number since
                signal.pidfd_send_signal(self.pidfd, signum)

    def release(self) -> None:
        """Once the actor is gone: its exit status, and its pipe closed."""
        self.process.join(timeout=5.0)  # the fork server's word, at once, if it is still there
        self.conn.close()


def _pidfd(pid: int) -> int | None:
    """A descriptor of the forked actor process itself (Linux's pidfd), readable once it ends.
    A forked actor is the fork server's child, and the server's word on it (``is_alive()``, the
    process's sentinel) goes with the server: were the server killed, every live actor would
    read as dead, with exit code 255, and be restarted beside itself, writing into the slot
    handed on to its successor. None where the actor is gone already, or where the kernel has
    no pidfds (before Linux 5.3): there the server's word is all there is."""
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


class _Stopped(Exception):
    pass


def actor_context() -> Any:
    """How actor processes start: on Linux, forked from multiprocessing's fork server, a process
    that imports this module (torch, numpy, Gymnasium, rlherd) once, where a spawned actor would
    import them itself, 2-3 s of a core each (a tiny run with 8 actors takes 6 s on two cores,
    not 14). A plain fork of the learner would copy its threads and locks mid-use. The server
    lives as long as the process that started it, so a later run there starts its actors at
    once; each actor takes the run's environment, standard output and error from its pipe."""
    if not FORKED:
        return mp.get_context("spawn")
    context = mp.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def open_files_limit() -> None:
    """Raise this process's soft limit of open files to its hard limit, as Ray does: an actor's
    setup lends it a descriptor for every shared tensor until it took them (a TorchBeast layout
    of 48 actors of one environment has 96 slots of 8 tensors, and the common soft limit is
    1,024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def start_fork_server() -> None:
    """Start the fork server now, so its imports overlap the learner's setup, from this
    process's import path: Python 3.11's server leaves out the path it is given, and puts its
    working directory first (a ``json.py`` there would shadow the standard library's)."""
    actor_context()  # which names what the server imports
    with environ(**child_env(), PYTHONSAFEPATH="1"):
        forkserver.ensure_running()


class ActorPool:
    """The actor processes, their links, and (on-policy) the shared-memory slots."""

    def __init__(self, ctx: RunContext, source: SharedVariables, tables: list, slots, seed: int):
        self.ctx, self.source, self.tables, self.slots, self.seed = ctx, source, tables, slots, seed
        self.mp = actor_context()
        open_files_limit()
        self.stopping = threading.Event()
        self.setup = ActorSetup(ctx.builder, ctx.spec, ctx.env_id, ctx.env_kwargs, ctx.settings,
                                source, slots, [t.signature for t in tables])  # fmt: skip
        self.stop = self.mp.Event()  # the actors' (``stopping`` is the links' here)
        # The actors stop at the run's budget of steps themselves; a budget of episodes stops
        # them when the links hear of it.
        n = ctx.settings.num_actors
        cores = len(os.sched_getaffinity(0))
        if n > 4 * cores:
            say(f"note: {n} actor processes on {cores} core{'s' * (cores > 1)} take turns; "
                "past a few a core they add memory, not speed (--num-actors)")  # fmt: skip
        self.budget = Budget(self._steps_left(), self.mp.Array("q", n, lock=False))
        self.reported = [0] * n  # each actor's steps the run has counted
        self.free: queue.Queue[int] = queue.Queue()
        self.full: queue.Queue[tuple[int, int]] = queue.Queue()
        for i in range(len(slots or [])):
            self.free.put(i)
        self.restarts = 0
        self.links = [ActorLink(self, i, self._seed(i)) for i in range(ctx.settings.num_actors)]

    def _steps_left(self) -> int:
        """The run's actor steps left, as its recorder has counted them (mono counts them)."""
        recorder = self.ctx.recorder
        return recorder.total_steps - int(recorder.counters["actor_steps"])

    def _seed(self, i: int) -> int:
        # A restarted actor gets a new seed, so it does not replay its predecessor's episodes.
        return self.seed + 1000 * i + 100_003 * self.restarts

    def insert(self, table: int, item: dict, priority: float) -> None:
        while True:
            if self.stopping.is_set():
                raise _Stopped
            with contextlib.suppress(TimeoutError):
                self.tables[table].insert(item, priority, timeout=POLL_S)
                return

    def free_slot(self, actor: ActorLink) -> int:
        """A free slot for ``actor``; none once it died (its link gives up, so the restart can
        join it and no slot is taken by a dead actor)."""
        while True:
            if self.stopping.is_set() or actor.dead():
                raise _Stopped
            with contextlib.suppress(queue.Empty):
                return self.free.get(timeout=POLL_S)

    def check(self) -> None:
        """Restart actors that died; stop the run if one could not even start, or met a fault
        of the run's (a :class:`ConfigError`, which a restart would meet again)."""
        for i, link in enumerate(self.links):
            if link.error is not None and not link.thread.is_alive():
                raise ConfigError(link.error)  # close() ends the actor, alive or not
            if not link.dead():
                continue
            link.thread.join(timeout=5.0)
            link.release()
            if link.error is not None:
                raise ConfigError(link.error)
            code = link.process.exitcode
            if not link.started and code is not None and code > 0:
                # It raised before acting (a bad env, an unguarded script): restarting would
                # fail the same way. Killed by a signal instead, it is restarted below.
                raise RuntimeError(
                    f"actor process {i} failed while starting (exit code "
                    f"{link.process.exitcode}); see its traceback above. Scripts that call "
                    "rlherd.train(runtime='mono') must guard the call with "
                    "`if __name__ == '__main__':` (each actor process imports the script)."
                )
            self.restarts += 1
            self.budget.taken[i] = self.reported[i]  # steps it had not reported are not the
            # run's: its successor takes them again
            limit = MAX_RESTARTS_PER_ACTOR * len(self.links)
            if self.restarts > limit:
                raise RuntimeError(
                    f"actor processes died {self.restarts} times, the last {exit_status(code)}; "
                    "see the actor traceback above"
                )
            if link.held is not None:
                self.free.put(link.held)
            if FORKED and code == 255:  # what a fork server that is gone says of its actors
                # Process.start() would start a new one, but not from this process's path.
                start_fork_server()
            self.links[i] = ActorLink(self, i, self._seed(i))
            say(
                f"actor {i} died, {exit_status(code)}; restarted (restart {self.restarts} of at "
                f"most {limit})"
            )

    def close(self) -> None:
        """Stop every actor: they leave their loop at the next step; one waiting for a slot or
        an insert hears its pipe close once its link has given up."""
        self.stopping.set()
        self.stop.set()
        for link in self.links:
            link.thread.join(timeout=2.0)
            link.conn.close()
        deadline = time.monotonic() + 5.0
        for link in self.links:
            link.end(timeout=max(0.0, deadline - time.monotonic()))


class SlotDataset:
    """The learner's batches: ``per_batch`` full slots joined (a copy), then handed back."""

    def __init__(self, pool_slots: list[dict], per_batch: int):
        self.slots, self.per_batch = pool_slots, per_batch
        self.pool: ActorPool | None = None
        self.pending: list[tuple[int, int]] = []
        self.policy_lag = 0.0

    def __iter__(self) -> SlotDataset:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        while len(self.pending) < self.per_batch:
            try:
                self.pending.append(self.pool.full.get(timeout=POLL_S))
            except queue.Empty:
                raise TimeoutError("no full rollout slot yet") from None
        taken, self.pending = self.pending, []
        rollouts = [self.slots[i] for i, _ in taken]  # copied once, before they are freed
        if len(rollouts) == 1:
            rollouts = [{k: v.clone() for k, v in rollouts[0].items()}]
        batch = join(rollouts)
        now = self.pool.source.variables_version()
        self.policy_lag = float(np.mean([now - v for _, v in taken]))
        for i, _ in taken:
            self.pool.free.put(i)
        return batch


def run(ctx: RunContext) -> None:
    if FORKED:
        start_fork_server()
    builder, spec, settings = ctx.builder, ctx.spec, ctx.settings
    networks = builder.make_networks(spec, settings.device)
    source = SharedVariables(builder.make_networks(spec, "cpu"))
    source.publish(networks.state_dict())
    slots, tables = None, []
    if builder.dataflow == "replay":
        tables = builder.make_replay_tables(spec, insert_blocking=True)
        dataset = builder.make_dataset(tables, settings.device)
    else:
        dataset, slots = rollout_slots(builder, spec, settings, source)
    dataset, checkpointed = with_demonstrations(ctx, dataset, tables, ctx.seed)
    learner = builder.make_learner(networks, dataset, ctx.learner_budget, tables)
    if ctx.checkpoint is not None:
        with ctx.restoring():
            learner.load_state_dict(ctx.checkpoint["learner"])
            load_tables(checkpointed, ctx.checkpoint["tables"])
            set_rng_state(ctx.checkpoint["rng"])
        source.publish(networks.state_dict())
    # A resumed run's actors get fresh seeds, so they do not replay the first run's episodes.
    seed = ctx.seed + 7919 * int(ctx.recorder.counters["learner_steps"])
    pool = ActorPool(ctx, source, tables, slots, seed)
    if slots is not None:
        dataset.pool = pool

    def state() -> dict[str, Any]:
        return checkpoint_state(learner, ctx.recorder, tables=table_states(checkpointed, settings))

    try:
        while not ctx.recorder.done() and not ctx.stop.is_set():
            pool.check()
            ctx.recorder.set_run_count("actor_restarts", pool.restarts)
            try:
                metrics = learner.step()
            except TimeoutError:  # waiting for actors: look after them, then wait again
                ctx.tick(state)
                continue
            source.publish(networks.state_dict())
            if slots is not None:
                metrics.update(policy_lag=dataset.policy_lag, free_slots=pool.free.qsize(),
                               full_slots=pool.full.qsize())  # fmt: skip
            ctx.recorder.learner(metrics)
            ctx.tick(state, learner)
        ctx.finish(state, learner)
    finally:
        pool.close()
        if hasattr(dataset, "close"):
            dataset.close()


def rollout_slots(builder, spec, settings, source) -> tuple[SlotDataset, list[dict]]:
    """Shared-memory rollout slots of ``envs_per_actor`` environments, and their dataset."""
    k = settings.envs_per_actor
    if builder.batch_size % k:
        raise ConfigError(
            f"mono needs batch_size ({builder.batch_size}) to be a multiple of envs_per_actor "
            f"({k}); e.g. --envs-per-actor {min(k, builder.batch_size)} with a batch_size that "
            "it divides"
        )
    per_batch = builder.batch_size // k
    num_buffers = settings.num_buffers or max(2 * settings.num_actors, 2 * per_batch)
    if num_buffers < per_batch + settings.num_actors:
        raise ConfigError(
            f"num_buffers={num_buffers} is too few: the learner needs {per_batch} slots per "
            f"batch and each of the {settings.num_actors} actors one more; set --num-buffers "
            f">= {per_batch + settings.num_actors} (or 0 for the default)"
        )
    layout = rollout_layout(spec, builder.rollout_fields(spec))
    state = builder.make_policy(source.module).initial_state(k)
    slots = [allocate_rollout(layout, builder.unroll_length, k, state, share_memory=True)
             for _ in range(num_buffers)]  # fmt: skip
    return SlotDataset(slots, per_batch), slots
