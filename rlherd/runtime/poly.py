"""The ``poly`` runtime: PolyBeast (Küttler et al. 2019, section 5.2), for every agent.

Environments live in gRPC servers (:mod:`rlherd.envs.server`), started here (``num_servers``
local servers on Unix sockets, stopped at the end) or already running anywhere
(``env_servers``). In the learner process, ``num_actors`` actor threads hold one stream each
(``envs_per_actor`` environments) and run the agent's own actor on it in an environment loop.
The actor's policy is a :class:`BatchedPolicy`: every call goes to a :class:`DynamicBatcher`,
which runs the agent's policy once for all waiting actors on the learner's device, with
parameters it fetches from the learner (its variable source) whenever the learner stepped.
What actors produce goes, by dataflow, into a :class:`BatchingQueue` of rollouts (bounded, so
the policy lag is bounded; the learner joins ``batch_size / envs_per_actor`` per step) or
through the agent's adder into the learner's replay tables (rate-limited: actor threads wait).

Faults: a broken stream is retried with exponential backoff (``reconnects`` in the metrics) while
the other actors go on; a local server that dies is restarted (``server_restarts``). An
environment that raises in its server (:class:`~rlherd.envs.server.EnvFailed`) or data that does
not fit (``ProtocolError``) stops the run at once with that error: retrying would repeat it. A
server out of reach is said on stderr once when its first stream breaks and once when a stream
reaches it again (:class:`Outages`). If the
learner gets nothing for ``stall_timeout_s``, the run stops with the actors' last errors. A
resumed run continues the learner exactly; streams start new episodes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlherd import types as F
from rlherd.core import EnvSpec, VariableClient
from rlherd.envs.ids import child_env
from rlherd.errors import ConfigError, Stalled, exit_status
from rlherd.replay.rollouts import RolloutWriter, allocate_rollout, rollout_layout
from rlherd.run.loop import EnvironmentLoop
from rlherd.runtime import (
    RunContext,
    checkpoint_state,
    load_tables,
    say,
    set_rng_state,
    table_states,
    with_demonstrations,
)
from rlherd.runtime.batching import BatchingQueue, Closed, DynamicBatcher

SERVER_START_TIMEOUT_S = 120.0
MAX_BACKOFF_S = 5.0


class Outages:
    """The environment servers out of reach now: one line on stderr when a server goes (the
    first of its streams to break, or its process seen dead) and one when it is back (a stream
    to it opened and checked), however many actors' streams it serves. Thread-safe: actor
    threads report breaks and reconnections, the learner's thread dead local servers."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}  # address -> when it went
        self._lock = threading.Lock()

    def down(self, address: str, why: str) -> None:
        with self._lock:
            if address in self._since:
                return
            self._since[address] = time.monotonic()
        say(f"environment server {address} {why}")

    def up(self, address: str) -> None:
        with self._lock:
            since = self._since.pop(address, None)
        if since is not None:
            out = time.monotonic() - since
            say(f"environment server {address} answers again, after {out:.1f}s")


class LocalServers:
    """``n`` environment servers in subprocesses on Unix sockets; restarted if they die."""

    def __init__(self, env_id: str, n: int, envs_per_stream: int, env_kwargs: dict,
                 outages: Outages | None = None):  # fmt: skip
        self.outages = outages or Outages()
        self._dir = tempfile.TemporaryDirectory(prefix="rlherd-envs-")
        self.addresses = [f"unix:{Path(self._dir.name) / f'env-{i}.sock'}" for i in range(n)]
        self._args = [env_id, "--envs-per-stream", str(envs_per_stream)]
        if env_kwargs:
            self._args += ["--env-kwargs", json.dumps(env_kwargs)]
        self.procs: list[subprocess.Popen | None] = [None] * n
        self.restarts = 0
        try:
            for i in range(n):
                self._start(i)
            for i in range(n):
                self._wait_ready(i)
        except BaseException:
            self.close()
            raise

    def _start(self, i: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.addresses[i][len("unix:") :])
        # The server dies when its stdin, held open by this process, closes (--die-with-parent):
        # a preexec_fn would run between fork and exec of this threaded process, which Python
        # documents as unsafe.
        cmd = [sys.executable, "-m", "rlherd.envs.server", *self._args, "--die-with-parent"]
        self.procs[i] = subprocess.Popen(
            [*cmd, "--address", self.addresses[i]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, **child_env()),  # a factory's module is found there too
        )

    def _wait_ready(self, i: int) -> None:
        """Wait for the server's "serving ENV on ADDRESS" line."""
        proc = self.procs[i]
        ready, _, _ = select.select([proc.stdout], [], [], SERVER_START_TIMEOUT_S)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("serving"):
            proc.kill()
            proc.wait()
            err = proc.stderr.read()[-2000:]
            raise RuntimeError(f"environment server {i} did not start:\n{err}")

    def check(self) -> None:
        """Restart servers that died."""
        for i, proc in enumerate(self.procs):
            if proc.poll() is not None:
                self.outages.down(self.addresses[i], f"ended, {exit_status(proc.returncode)}; "
                                                     "restarting it")  # fmt: skip
                self.restarts += 1
                self._start(i)
                self._wait_ready(i)

    def close(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            if proc is None:
                continue
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                pipe.close()
        self._dir.cleanup()


class StreamEnvs:
    """A server stream seen as a vector environment (next-step autoreset, as the server's);
    observations are the stream's, an array or a dict of arrays. A multi-agent game's stream
    has its games' agents as rows, as :class:`~rlherd.envs.pettingzoo.AgentRows` has, and says
    which are ``absent``."""

    def __init__(self, stream):
        self.stream, self.num_envs = stream, stream.num_envs
        self.agents_per_game = len(set(stream.agents)) or 1
        self.absent = stream.first["absent"]

    def reset(self, seed: int | None = None):
        return self.stream.first["observation"], {}

    def step(self, actions: np.ndarray):
        out = self.stream.step(actions)
        self.absent = out["absent"]
        return out["observation"], out["reward"], out["terminated"], out["truncated"], {}

    def close(self) -> None:
        self.stream.close()


class BatchedPolicy:
    """Looks like the agent's policy to its actor, but sends every call through the shared
    :class:`DynamicBatcher`, which batches flat dicts of tensors: a dict observation travels as
    its fields (``obs.image``, ...), recurrent state batch-first."""

    def __init__(self, batcher: DynamicBatcher, initial_state):
        self.batcher, self.initial_state = batcher, initial_state

    def __call__(self, obs, first, state, generator):
        inputs = dict(F.obs_fields(F.OBS, obs), first=first)
        for j, s in enumerate(state):  # [layers, K, H] -> batch first
            inputs[f"state{j}"] = s.transpose(0, 1)
        out = self.batcher.compute(inputs)
        new_state = tuple(out.pop(f"state{j}").transpose(0, 1).cpu() for j in range(len(state)))
        return out, new_state


def _inference(policy, lock: threading.Lock, seed: int):
    """The batcher's function: the policy on every waiting actor's rows at once (under the lock
    the learner's thread holds while it copies new parameters in)."""
    generator = torch.Generator(getattr(policy, "device", "cpu")).manual_seed(seed)

    @torch.no_grad()
    def infer(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        n = sum(k.startswith("state") for k in inputs)
        state = tuple(inputs[f"state{j}"].transpose(0, 1).contiguous() for j in range(n))
        with lock:
            outputs, new_state = policy(F.obs_of(inputs, F.OBS), inputs["first"], state, generator)
        result = {k: v.cpu() for k, v in outputs.items()}
        for j, s in enumerate(new_state):
            result[f"state{j}"] = s.transpose(0, 1).cpu()
        return result

    return infer


class ThreadTable:
    """A learner's table as actor threads write to it: inserts wait for the rate limiter but
    give up (:class:`Closed`) once the run stops."""

    def __init__(self, table, stop: threading.Event):
        self.table, self.stop, self.signature = table, stop, table.signature

    def insert(self, item: dict, priority: float = 1.0) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                self.table.insert(item, priority, timeout=1.0)
                return
        raise Closed("the run is stopping")


class QueueDataset:
    """The learner's batches of rollouts from the batching queue, with the policy lag."""

    def __init__(self, queue: BatchingQueue):
        self.queue = queue
        self.source = None  # the learner, once it exists
        self.policy_lag = 0.0

    def __iter__(self) -> QueueDataset:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        got = self.queue.get(timeout=1.0)
        if got is None:
            raise TimeoutError("no batch of rollouts yet")
        batch, versions = got
        now = self.source.variables_version()
        self.policy_lag = float(np.mean([now - v for v in versions]))
        return batch


class Actors:
    """The actor threads: each connects a stream, runs the agent's actor in an environment loop
    and reconnects with exponential backoff when the stream breaks."""

    def __init__(self, ctx: RunContext, addresses, batcher, net, produce, seed: int,
                 outages: Outages | None = None):  # fmt: skip
        self.ctx, self.addresses, self.produce, self.seed = ctx, addresses, produce, seed
        self.outages = outages or Outages()
        self.policy_template = ctx.builder.make_policy(net)
        self.batcher = batcher
        self.reconnects = [0] * ctx.settings.num_actors
        self.last_errors: dict[int, str] = {}
        self.fatal: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._run, args=(i,), name=f"poly-actor-{i}", daemon=True)
            for i in range(ctx.settings.num_actors)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        import grpc

        from rlherd.envs.server import EnvStream, ProtocolError

        ctx, k = self.ctx, self.ctx.settings.envs_per_actor
        address = self.addresses[i % len(self.addresses)]
        backoff, attempt = 0.1, 0
        while not ctx.stop.is_set():
            envs = None
            try:
                seed = self.seed + 1000 * i + attempt
                envs = StreamEnvs(EnvStream(address, seed=seed, stop=ctx.stop))
                if envs.num_envs != k:
                    raise ConfigError(
                        f"{envs.stream.address} serves {envs.num_envs} environments per stream; "
                        f"set --envs-per-actor {envs.num_envs}"
                    )
                _check_served(envs.stream, ctx.spec)
                self.outages.up(address)
                policy = BatchedPolicy(self.batcher, self.policy_template.initial_state)
                actor = ctx.builder.make_actor(seed, policy, ctx.spec, self.produce(k), None)
                loop = EnvironmentLoop(envs, actor, ctx.recorder, seed)
                backoff = 0.1
                while not ctx.stop.is_set():
                    if ctx.recorder.done():  # the budget is spent: steps past it go unlearned
                        return
                    loop.step()
            except Closed:
                return
            except (grpc.RpcError, ConnectionError) as e:
                if ctx.stop.is_set():
                    return
                if isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    self._fail(ProtocolError(f"the server refused this client's data: "
                                             f"{e.details()}"))  # fmt: skip
                    return
                self.reconnects[i] += 1
                details = e.details() if isinstance(e, grpc.RpcError) else str(e)
                self.last_errors[i] = f"{type(e).__name__}: {details}"
                self.outages.down(address, f"does not answer ({' '.join(details.split())}); "
                                           "retrying")  # fmt: skip
                ctx.stop.wait(backoff)  # a run stopped meanwhile ends the wait
                backoff, attempt = min(2 * backoff, MAX_BACKOFF_S), attempt + 1
            except BaseException as e:  # a bug, bad data, the env's own error: will not fix itself
                self._fail(e)
                return
            finally:
                if envs is not None:
                    envs.close()

    def _fail(self, error: BaseException) -> None:
        """Stop the run: ``error`` is no fault of the network, and retrying will not fix it."""
        self.fatal.append(error)
        self.ctx.stop.set()

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=10)


def _check_served(stream, spec: EnvSpec) -> None:
    """The learner's networks were built for ``spec`` (the run's environment, made here): a
    server of other observations (other keys, dtypes or shapes) or actions is a configuration
    error, said here rather than deep inside a network."""
    served = EnvSpec.from_spaces(stream.env_id, stream.observation_space, stream.action_space)
    served = dataclasses.replace(served, agents=len(set(stream.agents)) or 1)
    for what in ("obs", "action_kind", "num_actions", "action_shape", "action_nvec", "agents"):
        if getattr(served, what) != getattr(spec, what):
            raise ConfigError(
                f"{stream.address} serves {stream.env_id} ({what} {getattr(served, what)}), "
                f"but this run's environment is {spec.env_id} ({what} {getattr(spec, what)})"
            )


def check_game(ctx: RunContext) -> None:
    """A multi-agent game's streams hold whole games (several policies' actors label their
    rows, so the batcher's whole policy knows whose each row is); the servers add no agent
    index."""
    spec, k = ctx.spec, ctx.settings.envs_per_actor
    if spec is None or spec.agents == 1:
        return
    if spec.agent_index:
        raise ConfigError("poly's environment servers do not add the agents' index to their "
                          "observations: drop --agent-index, or train on single, mono or "
                          "distributed")  # fmt: skip
    if k % spec.agents:
        example = spec.agents * max(1, k // spec.agents)
        raise ConfigError(f"{ctx.env_id} has {spec.agents} agents a game: --envs-per-actor "
                          f"({k}) must be a multiple of it, e.g. {example}")  # fmt: skip


def run(ctx: RunContext) -> None:
    check_game(ctx)
    settings = ctx.settings
    learner, dataset, tables, produce, queue = _learner(ctx)
    if ctx.checkpoint is not None:
        with ctx.restoring():
            learner.load_state_dict(ctx.checkpoint["learner"])
            load_tables(tables, ctx.checkpoint["tables"])
            set_rng_state(ctx.checkpoint["rng"])
    lock = threading.Lock()
    acting_net, client, batcher = _batched_policy(ctx, learner, lock)
    outages = Outages()
    servers, addresses = _servers(ctx, outages)
    # A resumed run's streams get fresh seeds, so they do not replay the first run's episodes.
    seed = ctx.seed + 7919 * int(ctx.recorder.counters["learner_steps"])
    actors = Actors(ctx, addresses, batcher, acting_net, produce, seed, outages)

    def state() -> dict[str, Any]:
        return checkpoint_state(learner, ctx.recorder, tables=table_states(tables, settings))

    try:
        actors.start()
        waited_since = time.monotonic()
        while not ctx.recorder.done() and not ctx.stop.is_set():
            if servers is not None:
                servers.check()
                ctx.recorder.set_run_count("server_restarts", servers.restarts)
            try:
                metrics = learner.step()
            except TimeoutError:
                if time.monotonic() - waited_since >= settings.stall_timeout_s:
                    ctx.write_checkpoint(state)  # between learner steps, as a stop's is
                    raise Stalled(
                        f"the learner got nothing for {settings.stall_timeout_s:.0f}s from the "
                        f"environment servers {', '.join(addresses)}; last errors: "
                        f"{actors.last_errors or 'none yet (streams still connecting)'}. Once "
                        f"they answer, continue with `rlherd train --resume "
                        f"{ctx.recorder.rundir.path}`."
                    ) from None
                ctx.tick(state)
                continue
            waited_since = time.monotonic()
            with lock:
                client.update()
            ctx.recorder.set_run_count("reconnects", sum(actors.reconnects))
            metrics.update(reconnects=sum(actors.reconnects), **batcher.stats())
            if queue is not None:
                metrics.update(policy_lag=dataset.policy_lag, **queue.stats())
            ctx.recorder.learner(metrics)
            ctx.tick(state, learner)
        if actors.fatal:
            raise actors.fatal[0]
        ctx.finish(state, learner)
    finally:
        ctx.stop.set()
        if queue is not None:
            queue.close()
        batcher.close()
        if servers is not None:
            servers.close()  # a thread waiting on its stream hears the end now
        actors.join()


def _learner(ctx: RunContext) -> tuple:
    """The learner and its dataset, the replay tables (none on-policy), what makes each actor's
    writer (an adder into the tables, or a rollout writer into the batching queue) and that
    queue (None for replay agents)."""
    builder, spec, settings = ctx.builder, ctx.spec, ctx.settings
    networks = builder.make_networks(spec, settings.device)
    if builder.dataflow == "replay":
        tables = builder.make_replay_tables(spec, insert_blocking=True)
        dataset = builder.make_dataset(tables, settings.device)
        thread_tables = [ThreadTable(t, ctx.stop) for t in tables]
        dataset, checkpointed = with_demonstrations(ctx, dataset, tables, ctx.seed)
        learner = builder.make_learner(networks, dataset, ctx.learner_budget, tables)
        return learner, dataset, checkpointed, lambda n: builder.make_adder(thread_tables, n), None
    queue, writers = _rollout_queue(builder, spec, settings, networks)
    dataset = QueueDataset(queue)
    learner = builder.make_learner(networks, dataset, ctx.learner_budget, [])
    dataset.source = learner
    return learner, dataset, [], writers(learner), queue


def _batched_policy(ctx: RunContext, learner, lock: threading.Lock) -> tuple:
    """The batcher's networks (PolyBeast's actor model) on the learner's device, the actors'
    variable source; the client that copies the learner's parameters into them after every
    learner step; and the dynamic batcher running the agent's policy on them."""
    builder, settings = ctx.builder, ctx.settings
    acting_net = builder.make_networks(ctx.spec, settings.device)
    acting_net.eval()
    client = VariableClient(learner, acting_net)
    client.update(wait=True)
    batcher = DynamicBatcher(
        _inference(builder.make_policy(acting_net), lock, ctx.seed),
        min_batch_size=settings.inference_min_batch,
        max_batch_size=max(settings.inference_min_batch,
                           settings.num_actors * settings.envs_per_actor),
        timeout_s=settings.inference_timeout_ms / 1000,
        device=settings.device,
    )  # fmt: skip
    return acting_net, client, batcher


def _servers(ctx: RunContext, outages: Outages):
    settings = ctx.settings
    if settings.env_servers:
        return None, settings.server_addresses()
    servers = LocalServers(ctx.env_id, settings.num_servers, settings.envs_per_actor,
                           ctx.env_kwargs, outages)  # fmt: skip
    return servers, servers.addresses


def _rollout_queue(builder, spec, settings, networks):
    """The batching queue of rollouts, and a maker of each actor's writer into it."""
    k = settings.envs_per_actor
    if builder.batch_size % k:
        raise ConfigError(
            f"poly needs batch_size ({builder.batch_size}) to be a multiple of envs_per_actor "
            f"({k}), the environments of one stream"
        )
    per_batch = builder.batch_size // k
    queue = BatchingQueue(per_batch, max(settings.num_buffers, 2 * per_batch))
    layout = rollout_layout(spec, builder.rollout_fields(spec))
    state = builder.make_policy(networks).initial_state(k)

    def writers(source):
        def produce(n: int) -> RolloutWriter:
            buffer = allocate_rollout(layout, builder.unroll_length, n, state)
            version = [source.variables_version()]

            def on_full(full):
                queue.put({name: t.clone() for name, t in full.items()}, extra=version[0])
                version[0] = source.variables_version()
                return full

            return RolloutWriter(buffer, on_full)

        return produce

    return queue, writers
