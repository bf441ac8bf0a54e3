"""The ``mono`` runtime: MonoBeast (Küttler et al. 2019, section 5.1).

``num_actors`` processes each step ``envs_per_actor`` environments with a CPU copy of the model
that lives in shared memory and is overwritten in place after every learner update. Rollouts are
written straight into ``num_buffers`` shared-memory slots; slot indices travel through a *free*
queue (to the actors) and a *full* queue (to the learner), so no rollout is ever pickled. Learner
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
import ctypes
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from rlherd.agents.impala.acting import allocate_rollout, rollout_fields
from rlherd.core import EnvSpec
from rlherd.run.config import ConfigError
from rlherd.run.recorder import Recorder
from rlherd.runtime import rng_state, set_rng_state

POLL_S = 0.5  # how often blocked learner threads wake to check for stop and dead actors
MAX_RESTARTS_PER_ACTOR = 20  # beyond this the fault is not transient: report it and stop


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies, so no actor is ever orphaned."""
    # Not Linux: no prctl, and daemon processes still cover normal exits.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def actor_process(
    index: int,
    builder,
    seed: int,
    net: torch.nn.Module,
    buffers: list[dict[str, torch.Tensor]],
    core_buffers: list[tuple[torch.Tensor, ...]],
    versions: torch.Tensor,
    model_version: torch.Tensor,
    held: torch.Tensor,
    started: torch.Tensor,
    free_queue,
    full_queue,
) -> None:
    """Fill free slots with rollouts until a ``None`` index arrives."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's to handle
    torch.set_num_threads(1)
    try:
        envs = builder.make_envs(builder.config.envs_per_actor)
        actor = builder.make_actor(net, envs, seed)
        started[index] = 1
        while (slot := free_queue.get()) is not None:
            held[index] = slot
            versions[slot] = model_version[0]
            core_state = actor.unroll(buffers[slot])
            for dst, src in zip(core_buffers[slot], core_state, strict=True):
                dst.copy_(src)
            held[index] = -1
            full_queue.put(slot)
        envs.close()
    except KeyboardInterrupt:
        pass
    except Exception:
        traceback.print_exc()
        raise


class ActorPool:
    """``num_actors`` actor processes filling ``num_buffers`` shared-memory rollout slots.

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
        self.held = torch.full((config.num_actors,), -1, dtype=torch.int64).share_memory_()
        self.started = torch.zeros(config.num_actors, dtype=torch.int8).share_memory_()
        self.ctx = mp.get_context("spawn")  # fork would copy the learner's threads and locks
        self.free_queue, self.full_queue = self.ctx.Queue(), self.ctx.Queue()
        for slot in range(num_buffers):
            self.free_queue.put(slot)
        self.processes: list[Any] = [None] * config.num_actors
        self.restarts = 0

    def __enter__(self) -> ActorPool:
        for i in range(len(self.processes)):
            self._start(i)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self, i: int) -> None:
        # A restarted actor gets a new seed, so it does not replay its predecessor's episodes.
        seed = self.seed + 1000 * i + 100_003 * self.restarts
        self.started[i] = 0
        args = (i, self.builder, seed, self.net, self.buffers, self.core_buffers, self.versions)
        args += (self.model_version, self.held, self.started, self.free_queue, self.full_queue)
        p = self.ctx.Process(target=actor_process, args=args, daemon=True)
        p.start()
        self.processes[i] = p

    def check(self) -> None:
        """Restart any actor that died; recover the slot it was filling."""
        for i, p in enumerate(self.processes):
            if p.is_alive():
                continue
            if not self.started[i]:
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
            slot = int(self.held[i])
            if slot >= 0:
                self.held[i] = -1
                self.free_queue.put(slot)
            p.join()
            self._start(i)

    def get_batch(self, stop: Callable[[], bool]):
        """``(batch, core_state, policy_lag)`` from ``slots_per_batch`` full slots, or ``None``
        once ``stop()`` is true. The slots are copied out and freed at once."""
        slots: list[int] = []
        while len(slots) < self.slots_per_batch:
            if stop():
                for s in slots:
                    self.free_queue.put(s)
                return None
            try:
                slots.append(self.full_queue.get(timeout=POLL_S))
            except queue.Empty:
                continue
        batch = {k: torch.cat([self.buffers[s][k] for s in slots], dim=1) for k in self.fields}
        core = tuple(
            torch.cat([self.core_buffers[s][j] for s in slots], dim=1)
            for j in range(len(self.core_buffers[0]))
        )
        lag = (self.model_version[0] - self.versions[slots]).float().mean().item()
        for s in slots:
            self.free_queue.put(s)
        return batch, core, lag

    def close(self) -> None:
        for _ in self.processes:
            self.free_queue.put(None)
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
        self.free_queue.close()
        self.full_queue.close()


def run_mono(
    builder,
    spec: EnvSpec,
    recorder: Recorder,
    seed: int,
    checkpoint: dict[str, Any] | None,
    save: Callable[[dict[str, Any]], None],
    stop: threading.Event,
) -> None:
    learner_net = builder.make_networks(spec)
    learner = builder.make_learner(learner_net, recorder.total_steps)
    if checkpoint is not None:
        learner.load_state_dict(checkpoint["learner"])
        set_rng_state(checkpoint["rng"])
    actor_net = builder.make_networks(spec)
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
                    metrics.update(policy_lag=lag, full_queue=pool.full_queue.qsize())
                    recorder.learner(metrics)
        except BaseException as e:  # surfaced by the main thread
            errors.append(e)

    def state() -> dict[str, Any]:
        return dict(learner=learner.state_dict(), recorder=recorder.state_dict(), rng=rng_state())

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
