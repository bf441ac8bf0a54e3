"""The ``poly`` runtime: PolyBeast (Küttler et al. 2019, section 5.2).

Environments live in gRPC servers (:mod:`rlherd.envs.server`), started here (``num_servers``
local servers on Unix sockets, stopped at the end) or already running anywhere
(``env_servers``). In the learner process, ``num_actors`` actor threads hold one stream each
(``envs_per_actor`` environments) and run IMPALA's own :class:`ImpalaActor` on it: every
environment output goes to a :class:`DynamicBatcher`, which runs the model once for all
waiting actors on the learner's device; every ``unroll_length`` steps the rollout (with the
recurrent state at its start) goes into a :class:`BatchingQueue`, whose bounded size limits the
policy lag. The learner joins ``batch_size / envs_per_actor`` rollouts per step.

Faults: a broken stream is retried with exponential backoff (``reconnects`` in the metrics) while
the other actors go on; a local server that dies is restarted (``server_restarts``). If no rollout
arrives for ``stall_timeout_s``, the run stops with the actors' last errors. A resumed run
continues the learner exactly; streams start new episodes.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlherd.agents.impala.acting import ImpalaActor, allocate_rollout, rollout_fields
from rlherd.core import EnvSpec
from rlherd.run.config import ConfigError
from rlherd.run.recorder import Recorder
from rlherd.runtime import checkpoint_state, die_with_parent, set_rng_state
from rlherd.runtime.batching import BatchingQueue, Closed, DynamicBatcher

SERVER_START_TIMEOUT_S = 120.0
MAX_BACKOFF_S = 5.0


class LocalServers:
    """``n`` environment servers in subprocesses on Unix sockets; restarted if they die."""

    def __init__(self, env_id: str, n: int, envs_per_stream: int, env_kwargs: dict):
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
        cmd = [sys.executable, "-m", "rlherd.envs.server", *self._args]
        self.procs[i] = subprocess.Popen(
            [*cmd, "--address", self.addresses[i]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent,
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
    """A server stream seen as the vector environment :class:`ImpalaActor` expects."""

    def __init__(self, stream):
        self.stream, self.num_envs = stream, stream.num_envs

    def reset(self, seed: int | None = None):
        return self.stream.first["observation"], {}

    def step(self, actions: np.ndarray):
        out = self.stream.step(actions)
        return out["observation"], out["reward"], out["terminated"], out["truncated"], {}

    def close(self) -> None:
        self.stream.close()


class BatchedInference:
    """Looks like the network to :class:`ImpalaActor`, but sends every call through the shared
    :class:`DynamicBatcher`; remembers the model version that answered."""

    device = torch.device("cpu")

    def __init__(self, batcher: DynamicBatcher, net: torch.nn.Module):
        self.batcher, self.initial_state = batcher, net.initial_state
        self.version = 0

    def __call__(self, obs, first, state):
        inputs = dict(obs=obs[0], first=first[0])
        for j, s in enumerate(state):  # [layers, K, H] -> batch first
            inputs[f"state{j}"] = s.transpose(0, 1)
        out = self.batcher.compute(inputs)
        self.version = int(out["version"][0])
        new_state = tuple(out[f"state{j}"].transpose(0, 1).cpu() for j in range(len(state)))
        outputs = dict(policy_logits=out["policy_logits"][None], baseline=out["baseline"][None])
        return outputs, new_state


def _inference_fn(net: torch.nn.Module, lock: threading.Lock, version: list[int]):
    @torch.no_grad()
    def infer(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        n = sum(k.startswith("state") for k in inputs)  # state0, state1, ... (LSTM h, c)
        state = tuple(inputs[f"state{j}"].transpose(0, 1).contiguous() for j in range(n))
        with lock:
            outputs, new_state = net(inputs["obs"][None], inputs["first"][None], state)
            v = version[0]
        result = dict(
            policy_logits=outputs["policy_logits"][0].cpu(),
            baseline=outputs["baseline"][0].cpu(),
            version=torch.full((inputs["obs"].shape[0],), v, dtype=torch.int64),
        )
        for j, s in enumerate(new_state):
            result[f"state{j}"] = s.transpose(0, 1)
        return result

    return infer


def run_poly(
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
    k, T = config.envs_per_actor, config.unroll_length
    if config.batch_size % k:
        raise ConfigError(
            f"poly needs batch_size ({config.batch_size}) to be a multiple of envs_per_actor "
            f"({k}), the environments of one stream"
        )
    rollouts_per_batch = config.batch_size // k
    learner_net = builder.make_networks(spec)
    learner = builder.make_learner(learner_net, recorder.total_steps)
    if checkpoint is not None:
        learner.load_state_dict(checkpoint["learner"])
        set_rng_state(checkpoint["rng"])
    actor_net = builder.make_networks(spec)  # on the learner's device, like PolyBeast's
    actor_net.load_state_dict(learner_net.state_dict())
    actor_net.eval()
    model_lock, version = threading.Lock(), [learner.num_steps]

    if config.env_servers:
        servers, addresses = None, [a.strip() for a in config.env_servers.split(",") if a.strip()]
    else:
        servers = LocalServers(builder.env_id, config.num_servers, k, builder.env_kwargs)
        addresses = servers.addresses
    batcher = DynamicBatcher(
        _inference_fn(actor_net, model_lock, version),
        min_batch_size=config.inference_min_batch,
        max_batch_size=max(config.inference_min_batch, config.num_actors * k),
        timeout_s=config.inference_timeout_ms / 1000,
        device=config.device,
    )
    queue = BatchingQueue(rollouts_per_batch, max(config.num_buffers, 2 * rollouts_per_batch))
    reconnects = [0] * config.num_actors
    last_errors: dict[int, str] = {}
    fatal: list[BaseException] = []
    fields = rollout_fields(spec, k, T)
    # A resumed run's streams get fresh seeds, so they do not replay the first run's episodes.
    base_seed = seed + 7919 * learner.num_steps

    def actor_loop(i: int) -> None:
        import grpc

        from rlherd.envs.server import EnvStream, ProtocolError

        backoff, attempt = 0.1, 0
        buf = allocate_rollout(fields)
        while not stop.is_set():
            envs = None
            try:
                stream_seed = base_seed + 1000 * i + attempt
                stream = EnvStream(addresses[i % len(addresses)], seed=stream_seed)
                envs = StreamEnvs(stream)
                if stream.num_envs != k:
                    raise ConfigError(
                        f"{stream.address} serves {stream.num_envs} environments per stream; "
                        f"set envs_per_actor={stream.num_envs}"
                    )
                inference = BatchedInference(batcher, actor_net)
                actor = ImpalaActor(inference, envs, seed=stream_seed)
                backoff = 0.1
                while not stop.is_set():
                    started = inference.version
                    core = actor.unroll(buf)
                    item = {name: t.clone() for name, t in buf.items()}
                    queue.put(item, extra=(core, started))
            except Closed:
                return
            except (grpc.RpcError, ConnectionError, ProtocolError) as e:
                if stop.is_set():
                    return
                reconnects[i] += 1
                details = e.details() if isinstance(e, grpc.RpcError) else str(e)
                last_errors[i] = f"{type(e).__name__}: {details}"
                time.sleep(backoff)
                backoff, attempt = min(2 * backoff, MAX_BACKOFF_S), attempt + 1
            except BaseException as e:  # a bug, not a fault of the network: stop the run
                fatal.append(e)
                stop.set()
                return
            finally:
                if envs is not None:
                    envs.close()

    threads = [
        threading.Thread(target=actor_loop, args=(i,), name=f"poly-actor-{i}", daemon=True)
        for i in range(config.num_actors)
    ]

    def parameters() -> dict[str, torch.Tensor]:
        return {n: v.detach().clone() for n, v in learner_net.state_dict().items()}

    try:
        for t in threads:
            t.start()
        waited = 0.0
        while not recorder.done() and not stop.is_set():
            got = queue.get(timeout=1.0)
            if servers is not None:
                servers.check()
                recorder.extra["server_restarts"] = servers.restarts
            if got is None:
                waited += 1.0
                if waited >= config.stall_timeout_s:
                    raise RuntimeError(
                        f"no rollout for {waited:.0f}s from the environment servers "
                        f"{', '.join(addresses)}; last errors: {last_errors or 'none'}"
                    )
                continue
            waited = 0.0
            batch, extras = got
            cores = tuple(
                torch.cat([core[j] for core, _ in extras], dim=1) for j in range(len(extras[0][0]))
            )
            metrics = learner.learn(batch, cores)
            with model_lock:
                actor_net.load_state_dict(learner_net.state_dict())
                version[0] = learner.num_steps
            recorder.rollout(batch)
            lag = float(np.mean([learner.num_steps - 1 - v for _, v in extras]))
            recorder.extra["reconnects"] = sum(reconnects)
            metrics.update(
                policy_lag=lag, reconnects=sum(reconnects), **batcher.stats(), **queue.stats()
            )
            recorder.learner(metrics)
            if evaluator is not None:
                evaluator.maybe_run(parameters)
            if recorder.tick():
                save(checkpoint_state(learner, recorder))
        if fatal:
            raise fatal[0]
        save(checkpoint_state(learner, recorder))
    finally:
        stop.set()
        queue.close()
        batcher.close()
        if servers is not None:
            servers.close()  # a thread waiting on its stream hears the end now
        for t in threads:
            t.join(timeout=10)
