"""The ``mono`` runtime: MonoBeast (Küttler et al. 2019, section 5.1).

``num_actors`` processes each step ``envs_per_actor`` environments with a CPU copy of the model
that lives in shared memory and is overwritten in place after every learner update. Rollouts are
written straight into ``num_buffers`` shared-memory slots; only slot indices travel (free slots to
the actors, full ones back to the learner), so no rollout is ever pickled. Learner
threads join ``batch_size / envs_per_actor`` full slots into a batch, hand the slots back, learn,
and refresh the actors' model.

Faults: the main thread watches the actor processes; one that dies is restarted (its slot is
recovered and the restart counted in the metrics) and the run goes on. SIGINT / SIGTERM stop the
run at the next learner step with a final checkpoint; actors ignore SIGINT, are told to stop, then
terminated, and die with the learner process if it is killed (``PR_SET_PDEATHSIG``).

A resumed run continues the learner exactly (parameters, optimiser, schedule, counters, RNG);
actors start fresh episodes, since their environments are not checkpointed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import torch.multiprocessing as mp

from rlherd.agents.impala.acting import allocate_rollout, rollout_fields
from rlherd.core import EnvSpec
from rlherd.run.config import ConfigError
from rlherd.run.recorder import Recorder
from rlherd.runtime import checkpoint_state, die_with_parent, set_rng_state

POLL_S = 0.5  # how often blocked learner threads wake to check for stop and dead actors
MAX_RESTARTS_PER_ACTOR = 20  # beyond this the fault is not transient: report it and stop


def actor_process(
    index: int,
    builder,
    seed: int,
    net: torch.nn.Module,
    buffers: list[dict[str, torch.Tensor]],
    core_buffers: list[tuple[torch.Tensor, ...]],
    versions: torch.Tensor,
    model_version: torch.Tensor,
    started: torch.Tensor,
    conn: Connection,
) -> None:
    """Fill the slots that arrive on ``conn``, answering each with its index, until ``None``."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's to handle
    torch.set_num_threads(1)
    try:
        # Actors are daemon processes, which may not start processes of their own.
        envs = builder.make_envs(builder.config.envs_per_actor, workers=0)
        actor = builder.make_actor(net, envs, seed)
        started[index] = 1
        while (slot := conn.recv()) is not None:
            versions[slot] = model_version[0]
            core_state = actor.unroll(buffers[slot])
            for dst, src in zip(core_buffers[slot], core_state, strict=True):
                dst.copy_(src)
            conn.send(slot)
        envs.close()
    except (KeyboardInterrupt, EOFError, BrokenPipeError):
        pass  # stopped, or the learner is gone
    except Exception:
        traceback.print_exc()
        raise


class ActorPool:
    """``num_actors`` actor processes filling ``num_buffers`` shared-memory rollout slots.

    Slot indices travel over one private pipe per actor (the learner sends a free slot, the actor
    answers with it when full), and the free and full lists live in this process. Shared
    ``multiprocessing.Queue``s would be simpler, but an actor killed while it holds a queue's
    internal lock deadlocks every other actor; a private pipe breaks alone.

    The learner side calls :meth:`get_batch` (which joins full slots and frees them), bumps
    :attr:`model_version` after refreshing :attr:`net`, and calls :meth:`check` regularly so dead
    actors are restarted. Use it as a context manager: leaving it stops every process.
    """

    def __init__(self, builder, spec: EnvSpec, net: torch.nn.Module, seed: int):
        config = builder.config
        k, T = config.envs_per_actor, config.unroll_length
        if config.batch_size % k:
            raise ConfigError(
                f"mono needs batch_size ({config.batch_size}) to be a multiple of envs_per_actor "
                f"({k}); e.g. --set envs_per_actor={min(k, config.batch_size)} with a batch_size "
                f"that it divides"
            )
        self.slots_per_batch = config.batch_size // k
        num_buffers = config.num_buffers or max(2 * config.num_actors, 2 * self.slots_per_batch)
        if num_buffers < self.slots_per_batch + config.num_actors:
            raise ConfigError(
                f"num_buffers={num_buffers} is too few: the learner needs {self.slots_per_batch} "
                f"slots per batch and each of the {config.num_actors} actors one more; set "
                f"num_buffers >= {self.slots_per_batch + config.num_actors} (or 0 for the default)"
            )
        self.builder, self.seed, self.net = builder, seed, net
        net.share_memory()
        self.fields = rollout_fields(spec, k, T)
        self.buffers = [
            allocate_rollout(self.fields, share_memory=True) for _ in range(num_buffers)
        ]
        self.core_buffers = [
            tuple(s.share_memory_() for s in net.initial_state(k)) for _ in range(num_buffers)
        ]
        self.versions = torch.zeros(num_buffers, dtype=torch.int64).share_memory_()
        self.model_version = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.started = torch.zeros(config.num_actors, dtype=torch.int8).share_memory_()
        self.ctx = mp.get_context("spawn")  # fork would copy the learner's threads and locks

        self.free: deque[int] = deque(range(num_buffers))
        self.full: deque[int] = deque()
        self.held: list[int | None] = [None] * config.num_actors  # slot each actor is filling
        self.processes: list[Any] = [None] * config.num_actors
        self.conns: list[Connection | None] = [None] * config.num_actors
        self.restarts = 0
        self._lock = threading.RLock()  # guards the lists, the pipes and restarts

    def __enter__(self) -> ActorPool:
        with self._lock:
            for i in range(len(self.processes)):
                self._start(i)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self, i: int) -> None:
        # A restarted actor gets a new seed, so it does not replay its predecessor's episodes.
        seed = self.seed + 1000 * i + 100_003 * self.restarts
        self.started[i] = 0
        parent, child = self.ctx.Pipe()
        args = (i, self.builder, seed, self.net, self.buffers, self.core_buffers, self.versions)
        p = self.ctx.Process(
            target=actor_process, args=(*args, self.model_version, self.started, child), daemon=True
        )
        p.start()
        child.close()  # only the actor holds its end, so its death reads as EOF here
        self.processes[i], self.conns[i] = p, parent
        self._feed(i)

    def _feed(self, i: int) -> None:
        """Hand actor ``i`` a free slot, if there is one; otherwise it waits for the next."""
        if self.held[i] is None and self.free:
            slot = self.free.popleft()
            self.held[i] = slot
            self.conns[i].send(slot)

    def _restart(self, i: int) -> None:
        """Actor ``i`` died: recover its slot and start a new one."""
        p = self.processes[i]
        p.join(timeout=5.0)
        if not self.started[i] and p.exitcode is not None and p.exitcode > 0:
            # It raised before its first rollout (a bad env, an unguarded script): restarting
            # would fail the same way. Killed by a signal instead, it is restarted below.
            raise RuntimeError(
                f"actor process {i} failed while starting (exit code {p.exitcode}); see its "
                "traceback above. Scripts that call rlherd.train(runtime='mono') must guard "
                "the call with `if __name__ == '__main__':` (actors are spawned processes)."
            )
        self.restarts += 1
        if self.restarts > MAX_RESTARTS_PER_ACTOR * len(self.processes):
            raise RuntimeError(
                f"actor processes died {self.restarts} times (last exit code {p.exitcode}); "
                "see the actor traceback above"
            )
        self.conns[i].close()
        if self.held[i] is not None:
            self.free.append(self.held[i])
            self.held[i] = None
        self._start(i)

    def _receive(self, timeout: float) -> None:
        """Collect finished slots (and deaths) from the actors' pipes for up to ``timeout`` s."""
        with self._lock:
            conns = {c: i for i, c in enumerate(self.conns)}
        for conn in wait(list(conns), timeout):
            i = conns[conn]
            with self._lock:
                if self.conns[i] is not conn:
                    continue  # already restarted by check()
                try:
                    slot = conn.recv()
                except (EOFError, OSError):
                    self._restart(i)
                    continue
                self.full.append(slot)
                self.held[i] = None
                self._feed(i)

    def check(self) -> None:
        """Restart any actor that died (also noticed when its pipe breaks)."""
        with self._lock:
            for i, p in enumerate(self.processes):
                if not p.is_alive():
                    self._restart(i)

    def get_batch(self, stop: Callable[[], bool]):
        """``(batch, core_state, policy_lag)`` from ``slots_per_batch`` full slots, or ``None``
        once ``stop()`` is true. The slots are copied out and handed back at once."""
        slots: list[int] = []
        while len(slots) < self.slots_per_batch:
            if stop():
                with self._lock:
                    self.full.extendleft(reversed(slots))
                return None
            with self._lock:
                while self.full and len(slots) < self.slots_per_batch:
                    slots.append(self.full.popleft())
            if len(slots) < self.slots_per_batch:
                self._receive(POLL_S)
        batch = {k: torch.cat([self.buffers[s][k] for s in slots], dim=1) for k in self.fields}
        core = tuple(
            torch.cat([self.core_buffers[s][j] for s in slots], dim=1)
            for j in range(len(self.core_buffers[0]))
        )
        lag = (self.model_version[0] - self.versions[slots]).float().mean().item()
        with self._lock:
            self.free.extend(slots)
            for i in range(len(self.processes)):
                self._feed(i)
        return batch, core, lag

    def queue_levels(self) -> dict[str, int]:
        with self._lock:
            return dict(free_slots=len(self.free), full_slots=len(self.full))

    def close(self) -> None:
        with self._lock:
            for conn in self.conns:
                if conn is not None:
                    with contextlib.suppress(OSError):
                        conn.send(None)
        deadline = time.monotonic() + 5.0
        for p in self.processes:
            if p is not None:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.processes:
            if p is not None and p.is_alive():
                p.terminate()
                p.join(timeout=2.0)
            if p is not None and p.is_alive():
                p.kill()
                p.join()
        for conn in self.conns:
            if conn is not None:
                conn.close()


def run_mono(
    builder,
    spec: EnvSpec,
    recorder: Recorder,
    seed: int,
    checkpoint: dict[str, Any] | None,
    save: Callable[[dict[str, Any]], None],
    stop: threading.Event,
    evaluator=None,
) -> None:
    learner_net = builder.make_networks(spec)
    learner = builder.make_learner(learner_net, recorder.total_steps)
    if checkpoint is not None:
        learner.load_state_dict(checkpoint["learner"])
        set_rng_state(checkpoint["rng"])
    actor_net = builder.make_networks(spec, device="cpu")
    actor_net.load_state_dict(learner_net.state_dict())
    # A resumed run's actors get fresh seeds, so they do not replay the first run's episodes.
    pool = ActorPool(builder, spec, actor_net, seed + 7919 * learner.num_steps)

    batch_lock, learn_lock = threading.Lock(), threading.Lock()
    errors: list[BaseException] = []
    stopping = lambda: stop.is_set() or bool(errors)

    def learn_loop() -> None:
        try:
            while not stop.is_set() and not recorder.done():
                with batch_lock:
                    got = pool.get_batch(stopping)
                if got is None:
                    return
                batch, core, lag = got
                with learn_lock:
                    if recorder.done():
                        return
                    metrics = learner.learn(batch, core)
                    actor_net.load_state_dict(learner_net.state_dict())
                    pool.model_version.add_(1)
                    recorder.rollout(batch)
                    metrics.update(policy_lag=lag, **pool.queue_levels())
                    recorder.learner(metrics)
        except BaseException as e:  # surfaced by the main thread
            errors.append(e)

    def state() -> dict[str, Any]:
        return checkpoint_state(learner, recorder)

    def parameters() -> dict[str, torch.Tensor]:
        with learn_lock:
            return {k: v.detach().clone() for k, v in learner_net.state_dict().items()}

    threads = [
        threading.Thread(target=learn_loop, name=f"learner-{i}", daemon=True)
        for i in range(builder.config.num_learner_threads)
    ]
    with pool:
        try:
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                if errors:
                    raise errors[0]
                pool.check()
                recorder.extra["actor_restarts"] = pool.restarts
                if evaluator is not None:
                    evaluator.maybe_run(parameters)
                if recorder.tick():
                    with learn_lock:
                        save(state())
                time.sleep(0.05)
            if errors:
                raise errors[0]
            with learn_lock:
                save(state())
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=10)
