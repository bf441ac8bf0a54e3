"""Run settings, apart from agent settings: where and how a runtime runs an agent.

One dataclass per runtime (its :class:`~rlherd.runtime.Runtime` names it), every field with its
comment (its ``--flag`` help), and a ``check()`` that refuses values it cannot run with, as agent
configs do. A setting reaches
a run from, in order of precedence: the user (``--num-actors 8``, or ``rlherd.train(...,
num_actors=8)``), the agent's suggestion for its preset (``runtime_defaults``, e.g. IMPALA's
``classic`` preset suggests 2 actors), and the defaults below. A setting the user gives that the
chosen runtime does not use is an error, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from typing import Any

from rlherd.config import apply_overrides
from rlherd.errors import ConfigError, NeedsInput

# Where a run runs, not what it is: a run's record is portable without them, and a resumed run
# may be given its own (another GPU, the cluster's new address and its machines' resources).
MACHINE_SETTINGS = ("device", "cuda_graph", "env_servers", "ray_address", "actor_resources",
                    "learner_resources")  # fmt: skip
# The address schemes gRPC's name resolution knows (host:port needs none).
GRPC_SCHEMES = ("unix", "unix-abstract", "dns", "ipv4", "ipv6", "vsock")


def check_device(device: str, name: str, here: bool = True) -> None:
    """``device`` (given as ``name``) is a torch device, and CUDA is on this machine if it names
    CUDA and is used ``here`` (not by a learner that may run on another machine)."""
    import torch

    try:
        torch.device(device)
    except RuntimeError:
        raise ConfigError(f"{name}={device!r} is not a torch device; give cpu, cuda or cuda:N"
                          ) from None  # fmt: skip
    if here and device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{name}={device!r} but CUDA is not available; use cpu")


@dataclass
class Common:
    device: str = "cpu"  # where the learner (and on `device`, everything) runs: cpu, cuda, cuda:1
    torch_threads: int = 1  # intra-op threads; more than the free cores made training 10x slower
    checkpoint_interval_s: float = 60.0  # between checkpoints (more if one takes >5% of it)
    log_interval_s: float = 5.0  # seconds between summary.json / progress bar updates
    total_episodes: int = 0  # also end the run after this many episodes (0: steps alone end it)
    policies: str = ""  # multi-agent: agents -> policies: shared, independent, NAME=PATTERN,...
    policy_overrides: dict = field(default_factory=dict)  # agent config fields per policy
    agent_index: bool = False  # multi-agent: each agent observes its index (one-hot) too
    opponent_every: int = 20_000  # turn-based games: steps between snapshots of the policy
    opponent_latest: float = 0.5  # ... the newest snapshot plays with this probability
    opponent_pool: int = 20  # ... snapshots kept (the oldest go)

    def check(self) -> None:
        """Raise :class:`ConfigError` for values this runtime cannot run with (subclasses add
        their fields' checks to their bases')."""
        at_least_one(self, "torch_threads", "opponent_every", "opponent_pool")
        at_least_zero(self, "checkpoint_interval_s", "log_interval_s")  # 0: as often as may be
        if self.total_episodes < 0:
            raise ConfigError(f"total_episodes must be >= 0 (0: no limit), got "
                              f"{self.total_episodes}")  # fmt: skip
        if not 0.0 <= self.opponent_latest <= 1.0:
            raise ConfigError(f"opponent_latest is a probability, got {self.opponent_latest}")
        check_device(self.device, "device", here=not self.learner_may_be_elsewhere())

    def learner_may_be_elsewhere(self) -> bool:
        """Whether the learner may run on another machine (with the GPU this one lacks)."""
        return False


@dataclass
class Demonstrations(Common):
    """Replay agents on the host runtimes may mix demonstrations into their batches."""

    demonstrations: str = ""  # mix in these episodes: a Minari dataset id, or expert[:N]
    demonstration_ratio: float = 0.0  # share of each batch taken from the demonstrations

    def check(self) -> None:
        super().check()
        ratio = self.demonstration_ratio
        if self.demonstrations and not 0.0 < ratio < 1.0:
            raise ConfigError(
                f"demonstration_ratio must be in (0, 1) to mix in demonstrations, got {ratio}; "
                "e.g. --demonstration-ratio 0.25"
            )
        if ratio and not self.demonstrations:
            raise ConfigError(
                "demonstration_ratio needs demonstrations to mix in: --demonstrations ID (a "
                "Minari dataset) or --demonstrations expert (the environment's scripted expert)"
            )


@dataclass
class Single(Demonstrations):
    num_envs: int | None = None  # environments stepped together (on-policy: the agent's batch_size)
    env_workers: int = 0  # processes stepping them (BatchEnv); 0: in this process
    native_vector_env: bool = True  # Atari through ale-py's C++ vector environment
    checkpoint_replay: bool = True  # replay in checkpoints: exact resume, 2x its memory to write
    record_dataset: str = ""  # write every training episode as this Minari dataset at the end

    def check(self) -> None:
        super().check()
        at_least_one(self, "num_envs")
        at_least_zero(self, "env_workers")


@dataclass
class Mono(Demonstrations):
    num_actors: int = 4  # actors: processes on mono, threads on poly (one server stream each)
    envs_per_actor: int = 8  # environments each actor steps
    num_buffers: int = 0  # on-policy: rollout slots (mono) / queued rollouts (poly); 0: auto
    native_vector_env: bool = True  # Atari through ale-py's C++ vector environment
    checkpoint_replay: bool = True  # replay tables go into checkpoints
    actor_nice: int = 10  # actors' niceness (0-19): on too few cores the learner runs first

    def check(self) -> None:
        super().check()
        at_least_one(self, "num_actors", "envs_per_actor")
        at_least_zero(self, "num_buffers")
        if not 0 <= self.actor_nice <= 19:
            raise ConfigError(f"actor_nice must be in 0..19 (niceness), got {self.actor_nice}")


@dataclass
class Poly(Demonstrations):
    num_actors: int = 4  # actor threads in the learner process, one server stream each
    envs_per_actor: int = 8  # environments per stream
    num_servers: int = 2  # local environment servers to start (Unix sockets)
    env_servers: str = ""  # or: addresses of running servers, "host:port,unix:/path,..."
    num_buffers: int = 0  # on-policy: rollouts the queue holds; 0: two batches' worth
    inference_min_batch: int = 1  # rows the dynamic batcher waits for (up to the timeout)
    inference_timeout_ms: float = 100.0  # longest wait for inference_min_batch rows
    stall_timeout_s: float = 120.0  # stop if no rollout / no transition arrives for this long
    checkpoint_replay: bool = True  # replay tables go into checkpoints

    def check(self) -> None:
        super().check()
        at_least_one(self, "num_actors", "envs_per_actor", "num_servers", "inference_min_batch")
        at_least_zero(self, "num_buffers", "inference_timeout_ms", "stall_timeout_s")
        addresses = self.server_addresses()
        if self.env_servers and not addresses:
            raise ConfigError(f"--env-servers {self.env_servers!r} names no server; give "
                              "host:port or unix:/path/to/socket, separated by commas")  # fmt: skip
        for address in addresses:
            scheme, _, rest = address.partition(":")  # gRPC's named schemes, else host:port
            host, _, port = address.rpartition(":")
            # gRPC wraps a port above 65535; 0 is a listening server's "pick one", never its own
            port_ok = port.isdigit() and 0 < int(port) <= 65535
            if not (scheme in GRPC_SCHEMES and rest or host and port_ok):
                raise ConfigError(f"--env-servers: {address!r} is not a server's address; give "
                                  "host:port (the port serve-env printed) or unix:/path/to/socket, "
                                  "separated by commas")  # fmt: skip


    def server_addresses(self) -> list[str]:
        """``env_servers``' addresses (none: poly starts servers of its own)."""
        return [a.strip() for a in self.env_servers.split(",") if a.strip()]


@dataclass
class Device(Common):
    num_envs: int | None = None  # games stepped together on the device (default: batch_size)
    compile: bool = False  # torch.compile the policies' forward passes
    cuda_graph: bool = False  # record each step (acting, rollouts, games) as a CUDA graph

    def check(self) -> None:
        super().check()
        at_least_one(self, "num_envs")
        if self.cuda_graph and not self.device.startswith("cuda"):
            raise ConfigError("cuda_graph records the steps on a CUDA device; add "
                              "--device cuda, or pass --cuda-graph false")  # fmt: skip
        if self.cuda_graph and self.compile:
            raise ConfigError("--cuda-graph records the policies as they are, and torch.compile "
                              "makes graphs of its own; choose one")  # fmt: skip


@dataclass
class Distributed(Demonstrations):
    num_actors: int = 4  # actor nodes (Ray actors), each stepping envs_per_actor environments
    envs_per_actor: int = 8  # environments each actor node steps
    num_buffers: int = 0  # on-policy: rollouts the queue table holds (bounds lag); 0: 2 batches
    rollouts_per_call: int = 0  # on-policy: rollouts per insert call; 0: one learner batch's worth
    insert_chunk: int = 64  # replay: items an actor node sends to the replay node in one call
    sample_prefetch: int = 16  # replay: batches a learner's call to the replay node brings back
    actor_cpus: float = 1.0  # CPUs per actor node (an embedded Ray fits them to this machine)
    ray_address: str = ""  # Ray cluster to join ("auto", "HOST:6379"); "": $RAY_ADDRESS or local
    actor_resources: dict = field(default_factory=dict)  # Ray resources each actor node asks for
    learner_resources: dict = field(default_factory=dict)  # ... the learner (replay beside it)
    native_vector_env: bool = True  # Atari through ale-py's C++ vector environment
    checkpoint_replay: bool = True  # the replay node's tables go into checkpoints

    def check(self) -> None:
        super().check()
        at_least_one(self, "num_actors", "envs_per_actor", "insert_chunk", "sample_prefetch")
        at_least_zero(self, "num_buffers", "rollouts_per_call")
        if not self.actor_cpus > 0:  # NaN too
            raise ConfigError(f"actor_cpus must be > 0, got {self.actor_cpus}")
        for name in ("actor_resources", "learner_resources"):
            asked = getattr(self, name)
            amounts = asked.values() if isinstance(asked, dict) else [None]
            if not all(type(v) in (int, float) and v > 0 for v in amounts):
                raise ConfigError(f"{name} maps Ray resource names to amounts > 0, e.g. "
                                  f'{{"actors": 1}}; got {asked!r}')  # fmt: skip
            if {"CPU", "GPU"} & set(asked):
                raise ConfigError(f"{name}: CPUs and GPUs are asked for by --actor-cpus and "
                                  "--device; name only your machines' own resources here")
            if asked and not self.learner_may_be_elsewhere():
                raise ConfigError(
                    f"{name} places nodes on the machines of a Ray cluster that offer those "
                    "resources (ray start --resources ...); join one with --ray-address, or "
                    "drop it for this machine's own Ray"
                )

    def learner_may_be_elsewhere(self) -> bool:
        return bool(self.ray_address or os.environ.get("RAY_ADDRESS"))


@dataclass
class Offline(Common):
    dataset: str = ""  # a Minari dataset id to learn from, offline (rlherd collect writes one)

    def check(self) -> None:
        super().check()
        if not self.dataset:
            raise NeedsInput(
                "the offline runtime learns from a dataset: pass --dataset ID (a Minari dataset; "
                "rlherd collect RUN --episodes N --out ID records one)", "--dataset ID"
            )
        if self.total_episodes:
            raise ConfigError("the offline runtime plays no episodes of its own (--total-steps "
                              "counts its learner steps): drop --total-episodes")  # fmt: skip


# Settings that only one dataflow's agents use (the other's would ignore them).
DATAFLOW_ONLY = {"num_buffers": "rollout", "rollouts_per_call": "rollout",
                 "checkpoint_replay": "replay", "insert_chunk": "replay",
                 "sample_prefetch": "replay", "demonstrations": "replay",
                 "demonstration_ratio": "replay"}  # fmt: skip


def names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def classes() -> dict[str, type]:
    """Each runtime's settings dataclass, by runtime name (the registry's runtimes)."""
    from rlherd.runtime import RUNTIMES

    return {name: runtime.settings for name, runtime in RUNTIMES.items()}


def all_fields() -> dict[str, dataclasses.Field]:
    """Every runtime setting by name (the CLI makes one flag of each)."""
    out: dict[str, dataclasses.Field] = {}
    for cls in classes().values():
        out.update({f.name: f for f in dataclasses.fields(cls)})
    return out


def field_help() -> dict[str, str]:
    """The comment after each field, as flag help."""
    import inspect

    helps: dict[str, str] = {}
    for cls in {c: None for s in classes().values() for c in reversed(s.__mro__)}:
        if not dataclasses.is_dataclass(cls):
            continue
        for line in inspect.getsource(cls).splitlines():
            name, sep, rest = line.strip().partition(":")
            if sep and "#" in rest and name.isidentifier():
                helps.setdefault(name, rest.split("#", 1)[1].strip())
    return helps


def resolve(
    runtime: str, suggested: dict[str, Any], given: dict[str, Any], dataflow: str | None = None
) -> Any:
    """The settings of ``runtime``: its defaults, then the agent's ``suggested`` values it uses,
    then the user's ``given`` ones, each of which it must use (for an agent of ``dataflow``,
    when given)."""
    wrong = sorted(k for k in given if DATAFLOW_ONLY.get(k, dataflow) != dataflow)
    if dataflow is not None and wrong:
        raise ConfigError(
            f"{', '.join(wrong)} only applies to {DATAFLOW_ONLY[wrong[0]]} agents; this agent "
            f"is a {dataflow} agent, which would ignore it"
        )
    every = classes()
    cls = every[runtime]
    used = names(cls)
    unused = sorted(set(given) - used)
    if unused:
        known = all_fields()
        lines = []
        for key in unused:
            if key in known:
                users = [r for r, c in every.items() if key in names(c)]
                lines.append(f"{key} is a setting of the {', '.join(users)} runtime(s)")
            else:
                close = difflib.get_close_matches(key, sorted(used), n=3)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                lines.append(f"{key} is not a runtime setting{hint}")
        raise ConfigError(
            f"the {runtime} runtime does not use: {'; '.join(lines)}. Its settings: "
            f"{', '.join(sorted(used))}"
        )
    settings = apply_overrides(cls(), {k: v for k, v in suggested.items() if k in used})
    settings = apply_overrides(settings, given)
    settings.check()
    return settings


def at_least_one(settings: Any, *names: str) -> None:
    for name in names:
        value = getattr(settings, name)
        if value is not None and not value >= 1:  # NaN too
            raise ConfigError(f"{name} must be >= 1, got {value}")


def at_least_zero(settings: Any, *names: str) -> None:
    for name in names:
        if not getattr(settings, name) >= 0:  # NaN too
            raise ConfigError(f"{name} must be >= 0, got {getattr(settings, name)}")
