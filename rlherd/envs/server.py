"""Environment servers over gRPC (PolyBeast's), and the client stream that talks to one.

``rlherd serve-env ENV --address ADDR [--envs-per-stream K]`` serves ``ENV``: every client stream
gets ``K`` environments of its own, stepped with next-step autoreset, and receives after every
action their observations, rewards and flags (clients count episodes). The wire format is
``rlherd/envs/proto/env_server.proto``: typed arrays (dtype, shape, raw bytes), never pickle, so
a simulator in another language can serve too. An observation is one array, or a dict of named
arrays (one per key of a flat ``Dict`` space, as :func:`rlherd.envs.make` gives them).

An exception raised by the environment (making, resetting or stepping it) ends the stream with
``FAILED_PRECONDITION`` (``ENV_FAILED``) and the environment's traceback, which the client raises
as :class:`EnvFailed`: a status gRPC never gives itself, so it is not taken for an outage. A
:class:`~rlherd.errors.ConfigError` (rlherd's own one line on the environment, as its check of
each step's output) travels as that line, marked in the trailing metadata, and the client raises
it as one, as in-process environments do.

Everything received is validated (dtype, shape, byte count, size limit, action inside the action
space; by the client, a step's arrays against the spec: observation keys, dtypes and shapes); a
malformed message ends *that* stream with ``INVALID_ARGUMENT`` (by the client: ``ProtocolError``)
and a message that says what was wrong, and the server goes on serving the others. Servers bind
to loopback (``127.0.0.1:PORT``) or a Unix socket (``unix:PATH``) unless given another address,
and stop cleanly on SIGTERM / SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import gymnasium as gym
import numpy as np

from rlherd.errors import ConfigError, MissingExtra

try:
    import grpc
    from google.protobuf.message import DecodeError

    from rlherd.envs.proto import env_server_pb2 as pb
except ImportError as e:  # depends on the install
    raise MissingExtra("environment servers need gRPC: pip install 'rlherd[grpc]'") from e

from rlherd import envs as rl_envs

METHOD = "/rlherd.env.EnvServer/Stream"
DEFAULT_ADDRESS = "127.0.0.1:50051"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # far above any frame batch; gRPC rejects larger ones
FIRST_MESSAGE_S = 10.0  # a stream whose client sends no Reset for this long is cancelled
IDLE_S = 300.0  # a stream whose client sends nothing for this long is cancelled
STOP_S = 5.0  # the longest `serve-env` takes to stop on SIGTERM / SIGINT
STEP_S = 60.0  # a client's stream is cancelled if the server does not answer a step this fast
FIRST_REPLY_S = 180.0  # ... or its first message (its environments are being built) this fast
# How a stream ends when the environment itself raised: a status gRPC never gives on its own
# (a fault of the network or the server's process is UNAVAILABLE, CANCELLED, ...), so a client
# tells the environment's bug, which retrying repeats, from an outage.
ENV_FAILED = grpc.StatusCode.FAILED_PRECONDITION
MAX_TRACEBACK_CHARS = 8000  # the end of the environment's traceback, where it raised
CONFIG_ERROR = "rlherd-config-error"  # ENV_FAILED's metadata: a ConfigError, one line to show
DTYPES = frozenset(
    ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
     "float16", "float32", "float64")
)  # fmt: skip


class ProtocolError(ValueError):
    """A message that does not follow env_server.proto or does not fit the environment."""


class EnvFailed(RuntimeError):
    """The environment raised inside its server (its status ``ENV_FAILED``); the message is the
    server's address and the environment's id and traceback there. Its own bug or bad output
    (a wrong-shape observation), which reconnecting would only repeat."""


# ------------------------------------------------------------------------------ typed arrays
def to_array(x: np.ndarray) -> pb.Array:
    x = np.asarray(x)
    if x.dtype.name not in DTYPES:
        raise ProtocolError(f"dtype {x.dtype.name} cannot be sent; use one of {sorted(DTYPES)}")
    data = x.astype(x.dtype.newbyteorder("<"), copy=False).tobytes()
    return pb.Array(dtype=x.dtype.name, shape=x.shape, data=data)


def from_array(msg: pb.Array, what: str = "array") -> np.ndarray:
    """The numpy array of a message, after checking its dtype, shape and byte count."""
    if msg.dtype not in DTYPES:
        raise ProtocolError(
            f"{what}: unknown dtype {msg.dtype!r}; expected one of {sorted(DTYPES)}"
        )
    shape = tuple(msg.shape)
    dtype = np.dtype(msg.dtype).newbyteorder("<")
    # An empty array of a huge shape ([0, 2**62]) holds no bytes, but no array can have it.
    room = math.prod(max(d, 1) for d in shape) * dtype.itemsize
    if any(d < 0 for d in shape) or len(shape) > 32 or room > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"{what}: invalid shape {shape}")
    expected = math.prod(shape) * dtype.itemsize
    if len(msg.data) != expected:
        raise ProtocolError(
            f"{what}: shape {shape} of {msg.dtype} needs {expected} bytes, got {len(msg.data)}"
        )
    return np.frombuffer(msg.data, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def space_to_proto(space: gym.Space) -> pb.Space:
    """``space`` as a message: an array space (``Discrete`` and ``MultiDiscrete`` counted from 0,
    ``MultiBinary``, ``Box``) or a ``Dict`` of them, one level deep, as
    :func:`rlherd.envs.make` gives observation spaces."""
    if isinstance(space, gym.spaces.Dict):
        entries = {}
        for key, sub in space.spaces.items():
            if not isinstance(key, str) or not key:
                raise ProtocolError(f"dict space keys are non-empty strings, got {key!r}")
            if isinstance(sub, gym.spaces.Dict | gym.spaces.Tuple):
                raise ProtocolError(
                    f"dict space entry {key!r} is a {type(sub).__name__}; dict spaces are served "
                    "one level deep (rlherd.envs.make flattens them, keys joined by '.')"
                )
            entries[key] = space_to_proto(sub)
        return pb.Space(kind="dict", spaces=entries)
    if isinstance(space, gym.spaces.Discrete) and int(space.start) == 0:
        return pb.Space(kind="discrete", n=int(space.n))
    if isinstance(space, gym.spaces.MultiDiscrete) and not space.start.any():
        return pb.Space(kind="multidiscrete", nvec=to_array(space.nvec))
    if isinstance(space, gym.spaces.MultiBinary):
        return pb.Space(kind="multibinary", shape=space.shape)
    if isinstance(space, gym.spaces.Box):
        return pb.Space(kind="box", low=to_array(space.low), high=to_array(space.high))
    raise ProtocolError(
        f"space {space!r} cannot be served; Discrete(n), MultiDiscrete (counted from 0), "
        "MultiBinary, Box and a Dict of them are supported"
    )


def space_from_proto(msg: pb.Space) -> gym.Space:
    """The space a message describes, after checking that it describes one (a dict's entries
    are array spaces: rlherd's dict observations are one level deep)."""
    if msg.kind == "discrete":
        if msg.n < 1:
            raise ProtocolError(f"discrete space needs n >= 1, got {msg.n}")
        return gym.spaces.Discrete(msg.n)
    if msg.kind == "box":
        low, high = from_array(msg.low, "box low"), from_array(msg.high, "box high")
        if low.shape != high.shape or low.dtype != high.dtype:
            raise ProtocolError(f"box bounds disagree: {low.shape}/{low.dtype} vs {high.shape}")
        return gym.spaces.Box(low, high, dtype=low.dtype)
    if msg.kind == "multidiscrete":
        nvec = from_array(msg.nvec, "multidiscrete nvec")
        if nvec.dtype.kind not in "iu" or nvec.size == 0 or (nvec < 1).any():
            raise ProtocolError(
                f"multidiscrete space needs an nvec of integers >= 1, got {nvec.size} of "
                f"{nvec.dtype}: {nvec.ravel()[:8].tolist()}"
            )
        return gym.spaces.MultiDiscrete(nvec, dtype=nvec.dtype)
    if msg.kind == "multibinary":
        shape = tuple(msg.shape)
        if not shape or len(shape) > 32 or min(shape) < 1 or math.prod(shape) > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"multibinary space needs a shape of sizes >= 1, got {shape}")
        return gym.spaces.MultiBinary(shape[0] if len(shape) == 1 else list(shape))
    if msg.kind == "dict":
        if not msg.spaces:
            raise ProtocolError("dict space without entries")
        entries = {}
        for key, sub in msg.spaces.items():
            if not key:
                raise ProtocolError("dict space with an empty key")
            if sub.kind == "dict":
                raise ProtocolError(
                    f"dict space entry {key!r} is a dict; nested dicts are refused (rlherd's dict "
                    "observations are one level, nested keys joined by '.')"
                )
            entries[key] = space_from_proto(sub)
        return gym.spaces.Dict(entries)
    raise ProtocolError(
        f"unknown space kind {msg.kind!r}; expected 'discrete', 'box', 'multidiscrete', "
        "'multibinary' or 'dict'"
    )


def _categories(space: gym.Space) -> int | np.ndarray | None:
    """How many values each entry of an integer space takes (``0 .. n - 1``); None for a Box."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return space.nvec
    if isinstance(space, gym.spaces.MultiBinary):
        return 2
    return None


def check_action(action: np.ndarray, space: gym.Space, num_envs: int) -> np.ndarray:
    """``action`` for ``num_envs`` environments, if it has their shape and lies in ``space``."""
    shape = (num_envs, *space.shape)
    if action.shape != shape:
        raise ProtocolError(f"action: expected shape {shape}, got {action.shape}")
    categories = _categories(space)
    if categories is not None:
        if action.dtype.kind not in "iu":
            raise ProtocolError(f"action: {space} actions are integers, got {action.dtype}")
        bad = (action < 0) | (action >= categories)
        if bad.any():
            raise ProtocolError(
                f"action: {action[bad][0]} is outside {space} (environment "
                f"{int(np.argwhere(bad)[0][0])})"
            )
        return action.astype(space.dtype)
    if action.dtype.kind != "f":
        raise ProtocolError(f"action: box actions are floats, got {action.dtype}")
    inside = np.isfinite(action) & (action >= space.low) & (action <= space.high)
    if not inside.all():
        raise ProtocolError(
            f"action: values outside the box [{space.low.min()}, {space.high.max()}] or "
            "not finite; clip actions to the action space before sending"
        )
    return action.astype(space.dtype)


def observation_fields(obs: np.ndarray | dict[str, np.ndarray]) -> dict[str, Any]:
    """A Step's fields for ``obs``: ``observations`` (one array per key) for a dict
    observation, ``observation`` for an array."""
    if isinstance(obs, dict):
        return {"observations": {key: to_array(np.asarray(x)) for key, x in obs.items()}}
    return {"observation": to_array(np.asarray(obs))}


def check_observation(
    step: pb.Step, space: gym.Space, num_envs: int
) -> np.ndarray | dict[str, np.ndarray]:
    """A Step's observation of ``num_envs`` environments, if it fits ``space``: for a Dict
    space, a dict of exactly its keys (in its order), each array of its entry's dtype and
    shape ``[num_envs, *shape]``; otherwise one such array. Integer spaces' values are checked
    too (networks index embeddings with them); a Box's are not, to keep frames fast."""
    if not isinstance(space, gym.spaces.Dict):
        if step.observations:
            raise ProtocolError(
                f"named observations {sorted(step.observations)} for the array observation "
                f"space {space}"
            )
        if not step.HasField("observation"):
            raise ProtocolError("a Step without observation from the server")
        return _check_leaf(step.observation, space, num_envs, "observation")
    if step.HasField("observation"):
        raise ProtocolError(f"one observation array for the dict observation space {space}")
    missing = [key for key in space.spaces if key not in step.observations]
    unexpected = sorted(set(step.observations) - set(space.spaces))
    if missing or unexpected:
        raise ProtocolError(
            f"observations: keys {sorted(step.observations)} do not match the space's "
            f"{list(space.spaces)} (missing: {missing or 'none'}; unexpected: "
            f"{unexpected or 'none'})"
        )
    return {
        key: _check_leaf(step.observations[key], sub, num_envs, f"observation {key!r}")
        for key, sub in space.spaces.items()
    }


def _check_leaf(msg: pb.Array, space: gym.Space, num_envs: int, what: str) -> np.ndarray:
    """One observation array, if it is ``space``'s for ``num_envs`` environments."""
    x = from_array(msg, what)
    shape = (num_envs, *space.shape)
    if x.shape != shape or x.dtype != space.dtype:
        raise ProtocolError(
            f"{what}: expected shape {shape} of {space.dtype}, got {x.shape} of {x.dtype} from "
            "the server"
        )
    categories = _categories(space)
    if categories is not None and ((x < 0) | (x >= categories)).any():
        raise ProtocolError(f"{what}: values outside {space} from the server")
    return x


# ------------------------------------------------------------------------------ server
class StreamMonitor:
    """Cancels streams whose other side went silent: no first message within ``first_s``, or
    no message within ``idle_s`` after the last one (a server's silent clients cannot hold
    every slot; a client does not wait forever on a hung server). One thread checks every
    stream's deadline twice a second; a message only moves a number. A stream is anything
    with ``cancel()``: a server's RPC context, a client's call. A client's stream may come with
    its run's stop event, and is cancelled once that is set: a stopping run's read of a slow
    server ends within the half second, not at its deadline."""

    def __init__(self, first_s: float, idle_s: float):
        self.first_s, self.idle_s = first_s, idle_s
        # id(context) -> (deadline, context, stop event or None)
        self.deadlines: dict[int, tuple[float, Any, threading.Event | None]] = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True, name="stream-monitor").start()

    def opened(self, context, stop: threading.Event | None = None) -> None:
        with self.lock:
            self.deadlines[id(context)] = (time.monotonic() + self.first_s, context, stop)

    def heard(self, context, stop: threading.Event | None = None) -> None:
        with self.lock:
            self.deadlines[id(context)] = (time.monotonic() + self.idle_s, context, stop)

    def closed(self, context) -> None:
        with self.lock:
            self.deadlines.pop(id(context), None)

    def _watch(self) -> None:
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            with self.lock:  # checked and cancelled together: an answer in between is seen
                for key, (deadline, stream, stop) in list(self.deadlines.items()):
                    if deadline < now or (stop is not None and stop.is_set()):
                        del self.deadlines[key]
                        with contextlib.suppress(Exception):
                            stream.cancel()  # the blocked read of its next message ends


class EnvServicer:
    """Serves streams of ``envs_per_stream`` environments of ``env_id`` each."""

    def __init__(
        self,
        env_id: str,
        envs_per_stream: int = 1,
        first_message_s: float = FIRST_MESSAGE_S,
        idle_s: float = IDLE_S,
        **env_kwargs: Any,
    ):
        if env_id in rl_envs.MULTI_AGENT:
            raise ConfigError(
                f"{env_id} is a multi-agent game; environment servers serve single-agent "
                "environments and PettingZoo's parallel games (train it with --runtime device)"
            )
        if rl_envs.turn_based(env_id):
            raise ConfigError(
                f"{env_id} is turn-based, played against the learner's past selves, which live "
                "with the learner: train it on single, mono or distributed"
            )
        # A bad id or space fails before serving; a PettingZoo game is one game's agents.
        probe = rl_envs.make_one(env_id, **env_kwargs)
        self.agents: list[str] = list(getattr(probe, "possible_agents", []))
        if self.agents and envs_per_stream % len(self.agents):
            probe.close()
            raise ConfigError(f"{env_id} has {len(self.agents)} agents a game: envs_per_stream "
                              f"({envs_per_stream}) must be a multiple of it")  # fmt: skip
        if isinstance(probe, gym.vector.VectorEnv):
            probe.observation_space = probe.single_observation_space
            probe.action_space = probe.single_action_space
        try:
            if isinstance(probe.action_space, gym.spaces.Dict):
                raise ProtocolError(
                    f"{env_id}'s action space {probe.action_space!r} cannot be served: an Action "
                    "is one array"
                )
            self.observation_space = space_to_proto(probe.observation_space)
            self.action_space = space_to_proto(probe.action_space)
            self.action_numbers = math.prod(probe.action_space.shape)
            self.max_episode_steps = rl_envs.spec_of(probe, env_id).max_episode_steps or 0
        finally:
            probe.close()
        self.env_id, self.num_envs, self.env_kwargs = env_id, envs_per_stream, env_kwargs
        self.monitor = StreamMonitor(first_message_s, idle_s)

    def max_request_bytes(self) -> int:
        """The largest message a well-behaved client sends (an action for every environment of
        a stream, 8 bytes a number, and room for the envelope): gRPC refuses larger ones before
        reading them, so memory per stream stays this small whatever a client sends."""
        return 4096 + 8 * self.num_envs * self.action_numbers

    def stream(self, requests: Iterator[pb.ClientMessage], context) -> Iterator[pb.ServerMessage]:
        self.monitor.opened(context)
        try:
            yield from self._serve(self._heard(requests, context), context)
        finally:
            self.monitor.closed(context)

    def _heard(self, requests: Iterator[pb.ClientMessage], context) -> Iterator[pb.ClientMessage]:
        for message in requests:
            self.monitor.heard(context)
            if message is MALFORMED:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              "malformed message: not an rlherd.env.ClientMessage")  # fmt: skip
            yield message

    def _serve(self, requests: Iterator[pb.ClientMessage], context) -> Iterator[pb.ServerMessage]:
        first = next(requests, None)
        if first is None:
            return
        if first.WhichOneof("kind") != "reset":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a Reset")
        if first.reset.has_seed and first.reset.seed < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"reset: seed must be >= 0, got {first.reset.seed}")  # fmt: skip
        n = self.num_envs
        envs = self._run_env(context, rl_envs.make_vector, self.env_id, n, **self.env_kwargs)
        try:
            space = envs.single_action_space
            seed = first.reset.seed if first.reset.has_seed else None
            obs, _ = self._run_env(context, envs.reset, seed=seed)
            yield pb.ServerMessage(
                spec=pb.Spec(
                    env_id=self.env_id,
                    num_envs=n,
                    observation_space=self.observation_space,
                    action_space=self.action_space,
                    max_episode_steps=self.max_episode_steps,
                    agents=self.agents * (n // len(self.agents)) if self.agents else [],
                )
            )
            reward, terminated, truncated = np.zeros(n, np.float32), *[np.zeros(n, bool)] * 2
            while True:
                absent = {}  # a game's rows whose agent is away
                if self.agents:
                    absent = dict(absent=to_array(np.asarray(envs.absent)))
                yield pb.ServerMessage(
                    step=pb.Step(
                        **observation_fields(obs),
                        reward=to_array(reward),
                        terminated=to_array(terminated),
                        truncated=to_array(truncated),
                        **absent,
                    )
                )
                msg = next(requests, None)
                if msg is None:
                    return
                try:
                    if msg.WhichOneof("kind") != "action":
                        raise ProtocolError(f"expected an Action, got {msg.WhichOneof('kind')}")
                    action = check_action(from_array(msg.action.action, "action"), space, n)
                except ProtocolError as e:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                obs, reward, terminated, truncated, _ = self._run_env(context, envs.step, action)
                reward = np.asarray(reward, dtype=np.float32)
                terminated, truncated = np.asarray(terminated), np.asarray(truncated)
        finally:
            envs.close()

    def _run_env(self, context, call, *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)``, the environments' own code; what it raises ends the stream
        with ``ENV_FAILED`` and its traceback, so the client stops rather than reconnecting
        to an environment that raises again (a network fault is ``UNAVAILABLE``)."""
        try:
            return call(*args, **kwargs)
        except ConfigError as e:  # rlherd's own one line on it (its checks of a step's output)
            context.set_trailing_metadata(((CONFIG_ERROR, "1"),))
            named = str(e).startswith(self.env_id)  # StepCheck's do
            context.abort(ENV_FAILED, str(e) if named else f"{self.env_id}: {e}")
        except Exception as e:  # its frames, not this one's
            tb = "".join(traceback.format_exception(e.with_traceback(e.__traceback__.tb_next)))
            tb = tb[-MAX_TRACEBACK_CHARS:]
            context.abort(ENV_FAILED, f"{self.env_id} raised in its environment server:\n{tb}")


MALFORMED = object()  # what _parse_request makes of bytes that are not a ClientMessage


def _parse_request(data: bytes) -> pb.ClientMessage | object:
    """A client's message, or ``MALFORMED`` where the bytes are not one: the stream then ends
    with ``INVALID_ARGUMENT``. (gRPC ends it with ``INTERNAL`` when its deserializer raises or
    returns None, which blames the server for the client's bytes.)"""
    try:
        return pb.ClientMessage.FromString(data)
    except DecodeError:
        return MALFORMED


class BindError(OSError):
    """The server's address cannot be bound; the environment itself was made."""


def serve(
    env_id: str,
    address: str = DEFAULT_ADDRESS,
    envs_per_stream: int = 1,
    max_streams: int = 64,
    max_message_bytes: int | None = None,
    first_message_s: float = FIRST_MESSAGE_S,
    idle_s: float = IDLE_S,
    **env_kwargs: Any,
) -> tuple[grpc.Server, str]:
    """Start a server in background threads; returns it and the address it is bound to (a port
    of 0 picks a free one). Messages above ``max_message_bytes`` (default: the largest action
    message of a stream) are refused by gRPC (``RESOURCE_EXHAUSTED``) before they are read;
    streams silent for ``first_message_s`` before their first message, or ``idle_s`` after
    one, are cancelled."""
    servicer = EnvServicer(env_id, envs_per_stream, first_message_s, idle_s, **env_kwargs)
    if max_message_bytes is None:
        max_message_bytes = servicer.max_request_bytes()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_streams),
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # gRPC's default lets a second server bind a port in use, and the kernel then
            # deals each new stream to either: a port holds one server.
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=max_streams,
    )
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.stream,
        request_deserializer=_parse_request,
        response_serializer=pb.ServerMessage.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("rlherd.env.EnvServer", {"Stream": handler}),)
    )
    try:
        port = server.add_insecure_port(address)
    except RuntimeError:  # gRPC's "Failed to bind": a socket path it cannot make, a foreign host
        port = 0
    if port == 0:
        raise BindError(f"could not bind {address}: a port in use, a host that is not an "
                        "address of this machine, or a socket path that cannot be made")
    server.start()
    if address.startswith("unix:"):
        return server, address
    return server, f"{address.rsplit(':', 1)[0]}:{port}"


# ------------------------------------------------------------------------------ client
def _server_full(error: grpc.RpcError) -> bool:
    """Whether gRPC refused a stream because the server serves its most (``--max-streams``);
    its other ``RESOURCE_EXHAUSTED``, a message over the size limit, will not pass by waiting."""
    return (error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            and "Concurrent RPC limit" in (error.details() or ""))  # fmt: skip


class EnvStream:
    """One stream to an environment server: ``num_envs`` environments, stepped together.

    ``first`` holds the reset step; ``step(action)`` returns the next one, a dict of
    ``observation`` (an array, or for a dict observation space a dict of arrays, each of its
    space's dtype and shape ``[num_envs, ...]``), ``reward``, ``terminated``, ``truncated`` and
    ``absent`` (arrays ``[num_envs]``; ``absent``: a multi-agent game's rows whose agent is
    away, whose ids ``agents`` names). A broken connection raises ``grpc.RpcError``; a message
    that does not fit the spec, :class:`ProtocolError`; no server, or one serving its most
    streams for all of ``connect_timeout``, ``ConnectionError``; an environment that raised in
    the server, :class:`EnvFailed` (rlherd's one line on it, ``ConfigError``). Setting ``stop``
    (a run's stop event) ends those two waits within 0.1 s, and the wait for the server's first
    message (its environments being built) within 0.5 s, with ``ConnectionError``; a read of a
    step then raises ``grpc.RpcError`` (CANCELLED). So a stopping run's clients do not wait out
    their timeouts.
    """

    def __init__(
        self,
        address: str,
        seed: int | None = None,
        connect_timeout: float = 30.0,
        step_timeout: float = STEP_S,
        stop: threading.Event | None = None,
    ):
        self.address = address
        self.channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self._responses: Any = None
        self._monitor = _client_monitor(step_timeout)
        self._stop = stop or threading.Event()
        try:
            self._open(connect_timeout, seed)
        except BaseException:
            self.close()  # no channel is left open by a stream that failed to start
            raise

    def _open(self, connect_timeout: float, seed: int | None) -> None:
        """Connect and start the stream. A server serving its most streams (``--max-streams``)
        refuses more until one ends: the stream waits for a slot within ``connect_timeout``,
        as a client of a busy server should. Both waits look at ``stop`` every 0.1 s."""
        stop = self._stop
        deadline = time.monotonic() + connect_timeout
        ready = grpc.channel_ready_future(self.channel)
        while True:
            try:
                ready.result(timeout=0.1)
                break
            except grpc.FutureTimeoutError:
                if time.monotonic() >= deadline:
                    raise ConnectionError(
                        f"no environment server answered at {self.address}"
                    ) from None
                if stop.is_set():
                    raise self._stopped() from None
        while True:
            if stop.is_set():  # no Reset, which would have the server build environments
                raise self._stopped()
            try:
                return self._start(seed)
            except grpc.RpcError as e:
                if stop.is_set():  # the monitor cancelled the wait for the first message
                    raise self._stopped() from None
                if not _server_full(e):
                    raise
                self._requests.put(None)  # ends the refused call's request iterator (its thread)
                if time.monotonic() >= deadline:
                    raise ConnectionError(
                        f"the environment server at {self.address} serves its most streams "
                        f"(--max-streams) and none ended within {connect_timeout:g} s"
                    ) from None
                if stop.wait(0.1):
                    raise self._stopped() from None

    def _stopped(self) -> ConnectionError:
        return ConnectionError(f"stopped while connecting to {self.address}")

    def _start(self, seed: int | None) -> None:
        """Open the stream: reset with ``seed``, then read the server's Spec and first Step."""
        self._requests: queue.Queue = queue.Queue()
        method = self.channel.stream_stream(
            METHOD,
            request_serializer=pb.ClientMessage.SerializeToString,
            response_deserializer=pb.ServerMessage.FromString,
        )
        self._responses = method(iter(self._requests.get, None))
        reset = pb.Reset(has_seed=seed is not None, seed=seed or 0)
        self._requests.put(pb.ClientMessage(reset=reset))
        spec = self._next(first=True)
        if spec.WhichOneof("kind") != "spec":
            raise ProtocolError("the server did not start with a Spec")
        self.env_id = spec.spec.env_id
        self.num_envs = spec.spec.num_envs
        self.observation_space = space_from_proto(spec.spec.observation_space)
        self.action_space = space_from_proto(spec.spec.action_space)
        if isinstance(self.action_space, gym.spaces.Dict):
            raise ProtocolError("the server's action space is a dict; an Action is one array")
        self.agents = list(spec.spec.agents)  # a multi-agent game's: each row's agent
        if self.agents and len(self.agents) != self.num_envs:
            raise ProtocolError(f"the Spec names {len(self.agents)} agents for "
                                f"{self.num_envs} rows")  # fmt: skip
        self.first = self._read()

    def _next(self, first: bool = False) -> pb.ServerMessage:
        """The server's next message; a server silent for ``step_timeout`` (for its first
        message, which waits for its environments to be built: ``FIRST_REPLY_S`` at least) has
        the stream cancelled (``grpc.RpcError`` CANCELLED), so a hung server never hangs its
        client; so has a set ``stop``."""
        (self._monitor.opened if first else self._monitor.heard)(self._responses, self._stop)
        try:
            return next(self._responses)
        except grpc.RpcError as e:
            if e.code() == ENV_FAILED and (CONFIG_ERROR, "1") in (e.trailing_metadata() or ()):
                raise ConfigError(f"{e.details()} (in the environment server {self.address})"
                                  ) from None  # fmt: skip
            if e.code() == ENV_FAILED:
                raise EnvFailed(f"{self.address}: {e.details()}") from None
            raise
        finally:
            self._monitor.closed(self._responses)

    def _read(self) -> dict[str, Any]:
        msg = self._next()
        if msg.WhichOneof("kind") != "step":
            raise ProtocolError(f"expected a Step from the server, got {msg.WhichOneof('kind')}")
        n = self.num_envs
        step = {"observation": check_observation(msg.step, self.observation_space, n)}
        for name, kind in (("reward", "f"), ("terminated", "b"), ("truncated", "b")):
            if not msg.step.HasField(name):
                raise ProtocolError(f"a Step without {name} from the server")
            x = from_array(getattr(msg.step, name), name)
            if x.shape != (n,) or x.dtype.kind != kind:
                expected = "floats" if kind == "f" else "bools"
                raise ProtocolError(f"{name}: expected {n} {expected}, got {x.shape} of {x.dtype}")
            step[name] = x
        step["absent"] = np.zeros(n, dtype=bool)
        if msg.step.HasField("absent"):
            absent = from_array(msg.step.absent, "absent")
            if absent.shape != (n,) or absent.dtype.kind != "b":
                raise ProtocolError(f"absent: expected {n} bools, got {absent.shape} of "
                                    f"{absent.dtype}")  # fmt: skip
            step["absent"] = absent
        return step

    def step(self, action: np.ndarray) -> dict[str, Any]:
        self._requests.put(pb.ClientMessage(action=pb.Action(action=to_array(np.asarray(action)))))
        return self._read()

    def close(self) -> None:
        if self._responses is not None:
            self._requests.put(None)
            self._responses.cancel()
        self.channel.close()


_monitors: dict[float, StreamMonitor] = {}
_monitors_lock = threading.Lock()


def _client_monitor(step_timeout: float) -> StreamMonitor:
    """One monitor (one thread) per step timeout for all of a process's client streams."""
    with _monitors_lock:
        if step_timeout not in _monitors:
            first = max(step_timeout, FIRST_REPLY_S)
            _monitors[step_timeout] = StreamMonitor(first, step_timeout)
        return _monitors[step_timeout]


# ------------------------------------------------------------------------------ command line
def main(argv: list[str] | None = None) -> int:
    """``rlherd serve-env`` (also ``python -m rlherd.envs.server``)."""
    parser = argparse.ArgumentParser(prog="rlherd serve-env", description=__doc__.split("\n")[0],
                                     allow_abbrev=False)  # fmt: skip
    parser.add_argument("env", help="environment id, e.g. CartPole-v1 or ALE/Pong-v5")
    parser.add_argument(
        "--address",
        default=DEFAULT_ADDRESS,
        help=f"host:port or unix:PATH (default {DEFAULT_ADDRESS}: loopback only)",
    )
    parser.add_argument("--envs-per-stream", type=int, default=1, metavar="K")
    parser.add_argument("--max-streams", type=int, default=64)
    parser.add_argument("--die-with-parent", action="store_true",
                        help="exit when stdin closes (its starter holds it open)")  # fmt: skip
    parser.add_argument("--first-message-timeout", type=float, default=FIRST_MESSAGE_S,
                        metavar="S", help="cancel a stream with no Reset after S seconds")
    parser.add_argument("--idle-timeout", type=float, default=IDLE_S, metavar="S",
                        help="cancel a stream whose client sent nothing for S seconds")  # fmt: skip
    parser.add_argument(
        "--env-kwargs", default="{}", metavar="JSON", help="keyword arguments of rlherd.make"
    )
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if args.die_with_parent:  # the parent holds our stdin open while it lives
        threading.Thread(target=_exit_at_eof, daemon=True, name="die-with-parent").start()
    for flag, count in (("--envs-per-stream", args.envs_per_stream),
                        ("--max-streams", args.max_streams)):  # fmt: skip
        if count < 1:
            raise ConfigError(f"{flag} must be >= 1, got {count}")
    for flag, seconds in (("--first-message-timeout", args.first_message_timeout),
                          ("--idle-timeout", args.idle_timeout)):  # fmt: skip
        if not 0 < seconds < math.inf:
            raise ConfigError(f"{flag} must be a number of seconds > 0, got {seconds}")
    check_address(args.address)
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--env-kwargs must be a JSON object: {e}") from None
    if not isinstance(env_kwargs, dict):
        raise ConfigError(f"--env-kwargs must be a JSON object, got {args.env_kwargs!r}")
    try:
        server, address = serve(args.env, args.address, args.envs_per_stream, args.max_streams,
                                first_message_s=args.first_message_timeout,
                                idle_s=args.idle_timeout, **env_kwargs)  # fmt: skip
    except BindError as e:
        raise ConfigError(f"--address {e}") from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"serving {args.env} on {address}", flush=True)
    while not stop.wait(0.5):
        pass
    if not server.stop(grace=1.0).wait(timeout=STOP_S):
        # Handler threads stuck in an environment or a client's stream would keep the process
        # alive at exit (the executor joins its threads): stopping must be bounded.
        print(f"serve-env: streams still open after {STOP_S:.0f}s; exiting", flush=True)
        sys.stdout.flush()
        os._exit(1)
    return 0


def check_address(address: str) -> None:
    """``unix:PATH``, or ``host:port`` with a port gRPC can bind: it takes one above 65535
    modulo 65536, and binds another port than the one asked for."""
    if address.startswith(("unix:", "unix-abstract:")):
        if not address.partition(":")[2]:  # gRPC bound "unix:" to an abstract socket of no name
            raise ConfigError(f"--address {address!r} names no socket; give unix:PATH")
        return
    host, _, port = address.rpartition(":")
    if not (host and port.isdigit() and int(port) <= 65535):
        raise ConfigError(f"--address {address!r}: give host:port (a port from 0 to 65535; 0 "
                          "picks a free one) or unix:PATH")  # fmt: skip


def _exit_at_eof() -> None:
    """Die with the process that started this server (``--die-with-parent``): it holds this
    process's stdin open, so stdin ends when it does, however it ends."""
    sys.stdin.buffer.read()
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
