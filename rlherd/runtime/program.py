"""The nodes of a distributed program (Acme, section 2.4) and the clients that reach them.

A program is a replay node (an on-policy agent has none: its queue is in the learner node), a
learner node, ``num_actors`` actor nodes, an evaluator node and a counter, each a Ray actor
placed anywhere in a cluster (:mod:`rlherd.runtime.distributed` launches and supervises them).
Nodes meet the agent only through its builder, as every runtime does; what this module adds are
the remote stand-ins for the pieces that live elsewhere:

- :class:`InsertClient`: an actor's adder writes into it as into a table; items go to the replay
  node in chunks of ``insert_chunk`` (several per call when calls fall behind), rollouts to
  the learner's queue ``rollouts_per_call`` at a time, one call in flight, each waiting for
  the rate limiters there.
- :class:`TableClient`: the learner's dataset samples through it, ``sample_prefetch`` batches
  per call (and DQN writes priorities back).
- :class:`RemoteVariables`: the actors' and evaluator's ``VariableSource``, the learner node.
- :class:`QueueDataset`: on-policy batches from the queue table that the learner node holds,
  of whole rollouts (FIFO, each sampled once, inserts block while it is full: policy lag is
  bounded).

Arrays cross the network as numpy inside Ray's calls; Ray moves anything large through its
object store, and what comes out of it is read-only, so clients copy what they will write.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

from rlherd.replay.rollouts import RolloutWriter, allocate_rollout, rollout_layout
from rlherd.replay.table import RateLimiterTimeout, SampleBatch, Table
from rlherd.run.counting import StepReport
from rlherd.run.evaluation import EvalEpisodes
from rlherd.run.loop import EnvironmentLoop
from rlherd.run.recorder import mean_metrics
from rlherd.runtime import make_envs, seed_everything, torch_threads, with_demonstrations
from rlherd.runtime.node import Node, keeps_errors

POLL_S = 0.5  # the longest a blocked call waits before its caller looks at its stop flag again
STATS_PERIOD_S = 0.2  # actor nodes report steps and episodes at most this often
VERSION_POLL_S = 0.01  # off-policy actor nodes poll for newer parameters at most this often
PREFETCH_BYTES = 32 * 2**20  # the most a replay node's reply to a learner holds (Atari: 1 batch)
GATHER_CHUNKS = 16  # the most chunks an actor node's insert call takes when calls fall behind
GATHER_BYTES = 32 * 2**20  # ... and the most bytes (Atari sequences: one chunk)
PUBLISH_BYTES = 2**20  # parameters from this size on go to Ray's object store, once per version
READER_TURN_S = 0.005  # the longest a learner waits after a step for readers of its parameters
VERSION = "version"  # the field of a queued rollout that holds the parameters' version


class Stopped(Exception):
    """The node was told to stop while it waited."""


@dataclass
class NodeSetup:
    """What every node of an agent's program is built from (it must pickle)."""

    builder: Any
    spec: Any
    env_id: str
    env_kwargs: dict
    settings: Any  # rlherd.runtime.settings.Distributed
    seed: int  # the run's: the learner's networks start from it, as on every other runtime


# ------------------------------------------------------------------------------------ replay
class TableHost:
    """The calls an actor's :class:`InsertClient` and the driver make to the node that holds
    ``tables``: the replay node, or, for an on-policy agent, the learner node (its queue)."""

    tables: list[Table]

    def insert(self, index: int, columns: dict[str, np.ndarray], priorities: np.ndarray,
               timeout: float, most: int) -> tuple[int, int]:  # fmt: skip
        """Insert the rows of ``columns`` in order, each as the rate limiter allows; returns how
        many went in before ``timeout`` (the caller sends the rest again), and how many more the
        rate limiter would let in now, up to ``most`` (what the caller's next call may carry)."""
        table = self.tables[index]
        return table.insert_many(columns, priorities, timeout), table.inserts_allowed(most)

    def info(self) -> list[dict[str, Any]]:
        """Per table: its size and how many inserts and samples it has served."""
        return [dict(table=t.name, size=t.size, inserts=t.limiter.inserts,
                     samples=t.limiter.samples) for t in self.tables]  # fmt: skip


class ReplayNode(TableHost, Node):
    """Reverb's role: the agent's tables on their own node. Its calls run on threads, so a
    sample blocked by a rate limiter never stalls inserts."""

    @keeps_errors
    def __init__(self, make_tables: Callable[[], list[Table]]):
        torch_threads(1)
        self.tables = make_tables()

    def signatures(self) -> list[dict]:
        return [t.signature for t in self.tables]

    def names(self) -> list[str]:
        return [t.name for t in self.tables]

    def sample(self, index: int, n: int, timeout: float,
               batches: int = 1) -> tuple[SampleBatch, int] | None:  # fmt: skip
        """Up to ``batches`` batches of ``n`` items as one (the first waited for, the rest as
        many as the rate limiter allows now, within ``PREFETCH_BYTES``) and the table's insert
        count; or None after ``timeout``."""
        table = self.tables[index]
        batches = max(1, min(batches, PREFETCH_BYTES // (n * max(1, table.item_nbytes))))
        try:
            return table.sample(n, timeout, batches), table.insert_count
        except RateLimiterTimeout:
            return None

    def can_sample(self, index: int, n: int) -> bool:
        return self.tables[index].can_sample(n)

    def update_priorities(self, index: int, keys: np.ndarray, priorities: np.ndarray) -> None:
        self.tables[index].update_priorities(keys, priorities)

    def state_dicts(self) -> list[dict[str, np.ndarray]]:
        return [t.state_dict() for t in self.tables]

    def load_state_dicts(self, states: list[dict[str, np.ndarray]]) -> None:
        for table, state in zip(self.tables, states, strict=True):
            table.load_state_dict(state)


class TableClient:
    """A table on the replay node, as a learner's dataset and learner use one: ``sample``,
    ``can_sample``, ``update_priorities`` (not waited for), ``insert_count`` (as of the last
    call: DQN's exploration schedule runs on it).

    Batches come ``prefetch`` at a time (as many as the rate limiter allows), and the next call
    is sent as soon as one is back (as Reverb's dataset keeps samples in flight), so the round
    trip to the replay node overlaps the learner's updates and is paid once per ``prefetch``
    batches rather than per batch. Priorities set meanwhile reach batches after those in
    flight (up to ``2 * prefetch`` batches later)."""

    def __init__(self, replay: Any, index: int, name: str, prefetch: int = 1):
        self.replay, self.index, self.name, self.prefetch = replay, index, name, prefetch
        self.insert_count = 0
        self._ahead: dict[tuple, Any] = {}  # (batch_size, timeout) -> the call in flight
        self._ready: dict[tuple, list[SampleBatch]] = {}  # ... -> batches back, not yet taken

    def can_sample(self, n: int = 1) -> bool:
        """Whether a batch of ``n`` is here or the replay node could give one now."""
        if any(ready for (size, _), ready in self._ready.items() if size == n):
            return True
        return ray.get(self.replay.can_sample.remote(self.index, n))

    def sample(self, batch_size: int, timeout: float | None = None) -> SampleBatch:
        key, args = (batch_size, timeout), (self.index, batch_size, timeout, self.prefetch)
        ready = self._ready.setdefault(key, [])
        if not ready:
            answer = ray.get(self._ahead.pop(key, None) or self.replay.sample.remote(*args))
            self._ahead[key] = self.replay.sample.remote(*args)
            if answer is None:
                raise RateLimiterTimeout(f"no batch from table {self.name!r} within {timeout}s")
            batch, self.insert_count = answer
            ready.extend(reversed(batch.split(batch_size)))
        batch = ready.pop()
        batch.data = {k: np.array(v) for k, v in batch.data.items()}  # writable copies
        return batch

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        self.replay.update_priorities.remote(self.index, keys, priorities)


class InsertClient:
    """A table on another node (a :class:`TableHost`: the replay node, or the learner node's
    queue), as an actor's adder writes into one. Items are kept until ``chunk`` of them are
    here, then go to that node as columns in one call, with one
    call in flight: the actor acts on while it travels (as Reverb's writers keep items in
    flight). A call is done when the node took them all (its rate limiters hold across
    the network: what they held back is sent again); waiting for it raises :class:`Stopped`
    once ``stopping`` is set.

    A chunk made while the call is still out waits, and the next call takes every chunk
    waiting, up to ``gather`` of them (and ``GATHER_BYTES``), but no more than the table's rate
    limiter said it would take (each call's answer says how many): a Ray call costs about as
    much as inserting a few hundred items, so calls grow when an actor makes items faster than
    calls go, but an actor whose learner is behind still waits for it one chunk ahead, as
    before, instead of acting on for chunks the table will not take. A queue of rollouts
    gathers none (its waits bound the policy lag); its chunk is ``rollouts_per_call``."""

    def __init__(self, replay: Any, index: int, signature: dict | None, chunk: int,
                 stopping: threading.Event, gather: int = GATHER_CHUNKS,
                 variables: RemoteVariables | None = None):  # fmt: skip
        self.replay, self.index, self.signature = replay, index, signature
        self.chunk, self.stopping, self.gather = chunk, stopping, gather
        self.variables = variables  # asked after with each call (LearnerNode's queue inserts)
        self.cap = 0  # the most items one call takes: set from the first item's size
        self.room = 0  # items the table would take now, as of the last answer
        self.items: list[dict[str, np.ndarray]] = []
        self.priorities: list[float] = []
        self.in_flight: tuple[Any, dict[str, np.ndarray], np.ndarray] | None = None
        self.answered: Future | None = None  # the call in flight's, with ``variables``
        self.calls = self.sent = 0  # how many calls and items went (a benchmark's figures)

    def insert(self, item: dict, priority: float = 1.0, timeout: float | None = None) -> None:
        self.items.append(item)
        self.priorities.append(priority)
        if len(self.items) % self.chunk == 0:
            self.flush()

    def flush(self) -> None:
        """Send the chunks waiting, unless the call in flight is still out and more fit in the
        next one."""
        if not self.cap:
            size = sum(np.asarray(v).nbytes for v in self.items[0].values())
            self.cap = self.chunk * max(1, min(self.gather, GATHER_BYTES // (size * self.chunk)))
        most = max(self.chunk, min(self.cap, -(-self.room // self.chunk) * self.chunk))
        more_fit = len(self.items) < most  # asked first: it spares a Ray call when they don't
        if more_fit and self.in_flight and not ray.wait([self.in_flight[0]], timeout=0)[0]:
            return
        columns = {k: np.stack([np.asarray(item[k]) for item in self.items]) for k in self.items[0]}
        priorities = np.asarray(self.priorities, dtype=np.float64)
        self.items, self.priorities = [], []
        self.settle()
        self._send(columns, priorities)

    def poll(self) -> None:
        """With ``variables``: take the call in flight's answer if it is back, without waiting,
        so its parameters act from the next step on rather than from the next call's (the
        policy lag of IMPALA on CartPole, one rollout per call: 1.4 learner versions instead of
        2.3). A future's ``done()`` is what makes this cheap enough to ask every step:
        ``ray.wait`` there cost 12% of the steps per second."""
        if self.answered is not None and self.answered.done():
            self.settle()

    def settle(self) -> None:
        """Wait until the call in flight is done."""
        while self.in_flight is not None:
            call, columns, priorities = self.in_flight
            answer = ray.get(call)
            if self.variables is not None:
                answer, parameters = answer
                self.variables.take(parameters)
            taken, self.room = answer
            self.in_flight = self.answered = None
            if taken < len(priorities):
                self._send({k: v[taken:] for k, v in columns.items()}, priorities[taken:])

    def _send(self, columns: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        if self.stopping.is_set():
            raise Stopped
        args = (self.index, columns, priorities, POLL_S, self.cap)
        if self.variables is None:
            call = self.replay.insert.remote(*args)
        else:
            call = self.replay.insert_and_get_variables.remote(*args, *self.variables.question())
        self.in_flight = (call, columns, priorities)
        self.answered = call.future() if self.variables is not None else None
        self.calls, self.sent = self.calls + 1, self.sent + len(priorities)


# ----------------------------------------------------------------------------------- learner
class TakeTurns:
    """A lock whose busy owner (the learner, step after step) lets the readers waiting for it
    in after each of its turns. A Python lock is not fair: a learner that takes it again at
    once (its batches already here) kept a reader of its parameters waiting for up to seconds.
    The owner takes ``lock`` and calls :meth:`yield_to_readers` between turns, waiting up to
    ``wait_s`` for them; readers go through :meth:`reading`."""

    def __init__(self, wait_s: float):
        self.lock = threading.Lock()
        self.wait_s = wait_s
        self._turn = threading.Condition()
        self._readers = 0

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        with self._turn:
            self._readers += 1
        try:
            with self.lock:
                yield
        finally:
            with self._turn:
                self._readers -= 1
                self._turn.notify_all()

    def yield_to_readers(self) -> None:
        with self._turn:
            self._turn.wait_for(lambda: not self._readers, timeout=self.wait_s)


class LearnerNode(TableHost, Node):
    """The agent's learner on its own node (on a GPU when ``device`` says so), stepped in slices
    by the driver (:meth:`train`) and serving its parameters to every other node.

    An on-policy agent's queue of rollouts lives here (``make_queue``), as TorchBeast's learner
    holds its own: actor nodes insert into it as into a replay node's table, and a rollout
    crosses the network once, with no call to fetch it again (on a replay node, each rollout
    costs a call in and a share of a call out: on two cores, IMPALA on CartPole spends more
    time in those calls than in acting).

    Parameters are read under a lock that the learner holds while it steps, except while it
    waits for data, so a read never sees half an update and never waits for a rate limiter.
    Each version's answer is made once, however many nodes ask for it (from ``PUBLISH_BYTES``
    on, it is a reference to the one copy in Ray's object store)."""

    @keeps_errors
    def __init__(self, setup: NodeSetup, replay: Any, total_steps: int, per_batch: int = 0,
                 make_queue: Callable[[], list[Table]] | None = None):  # fmt: skip
        torch_threads(setup.settings.torch_threads)
        builder, device = setup.builder, setup.settings.device
        # A node's process starts with torch's random seed: without this, a run's first
        # parameters (and so how it explores) would differ from run to run of one seed.
        seed_everything(setup.seed)
        networks = builder.make_networks(setup.spec, device)
        self.turns = TakeTurns(READER_TURN_S)
        self.lock = self.turns.lock
        self._filling = threading.Lock()
        self.version = 0
        self._cache: tuple[int, dict[tuple, tuple]] = (-1, {})  # (version, {names: answer})
        tables: list[TableClient] = []
        self.tables = make_queue() if make_queue is not None else []  # hosted here (TableHost)
        if builder.dataflow == "replay":
            names = ray.get(replay.names.remote())
            prefetch = setup.settings.sample_prefetch
            tables = [TableClient(replay, i, name, prefetch) for i, name in enumerate(names)]
            dataset = builder.make_dataset(tables, device)
            # Demonstrations live here, beside the learner; a resumed run reads them again.
            dataset, _ = with_demonstrations(setup, dataset, tables, seed=0)
        else:
            dataset = QueueDataset(self.tables[0], per_batch, device, lambda: self.version)
        self.dataset = dataset
        unlocked = _UnlockedWhileWaiting(dataset, self.lock)
        self.learner = builder.make_learner(networks, unlocked, total_steps, tables)

    def train(self, seconds: float) -> tuple[int, dict[str, float]]:
        """Learner steps for about ``seconds`` (fewer if a batch is not ready): how many, and
        their mean metrics (read once per slice, not per step)."""
        torch.set_flush_denormal(True)  # per thread, and Ray picks the thread: see torch_threads
        learned: list[tuple[int, dict[str, Any]]] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                with self.lock:
                    metrics = self.learner.step()
                    self.version += 1
            except TimeoutError:
                break  # the actors are behind: let the driver look after them
            self.turns.yield_to_readers()
            lag = getattr(self.dataset, "policy_lag", None)
            learned.append((1, metrics if lag is None else dict(metrics, policy_lag=lag)))
        return len(learned), mean_metrics(learned)

    def get_variables(self, names: list[str], newer_than: int = -1) -> tuple[int, list | None, Any]:
        """The version, and per name the learner's state as numpy arrays: in the answer
        ``(version, states, None)``, or, from ``PUBLISH_BYTES`` on, put in Ray's object store
        once per version and names however many nodes ask, as ``(version, None, reference)``:
        each asker reads the same copy (on the learner's machine, without copying it) instead
        of each answer pickling its own. Small states go in the answer: a put and a second
        fetch cost more than they save. :func:`fetch_variables` reads either.

        An asker that has version ``newer_than`` gets ``(version, None, None)`` until there is
        a newer one: asking is also how actors poll, one call instead of a poll and a fetch."""
        if self.version <= newer_than:
            return self.version, None, None
        key = tuple(names)
        version, cached = self._cache
        if version == self.version and key in cached:  # no lock: the cache is replaced whole
            return version, *cached[key]
        with self._filling:  # one reader makes a version's answer; the others then read it
            version, cached = self._cache
            if version == self.version and key in cached:
                return version, *cached[key]
            with self.turns.reading():
                states = [{k: v.detach().cpu().numpy().copy() for k, v in state.items()}
                          for state in self.learner.get_variables(names)]  # fmt: skip
                version = self.version
            size = sum(v.nbytes for state in states for v in state.values())
            answer = (None, ray.put(states)) if size >= PUBLISH_BYTES else (states, None)
            cached = cached if self._cache[0] == version else {}
            self._cache = (version, {**cached, key: answer})
            return version, *answer

    def insert_and_get_variables(self, index: int, columns: dict[str, np.ndarray],
                                 priorities: np.ndarray, timeout: float, most: int,
                                 names: list[str], newer_than: int) -> tuple:  # fmt: skip
        """``insert`` into the queue, then ``get_variables(names, newer_than)``: each of an
        on-policy actor node's insert calls is also its poll for parameters. Polls of their own,
        as often, cost IMPALA on CartPole a fifth of its steps per second on two cores."""
        taken = self.insert(index, columns, priorities, timeout, most)
        return taken, self.get_variables(names, newer_than)

    def state_dict(self) -> dict[str, Any]:
        """On the CPU: the driver that checkpoints it may have no GPU."""
        with self.lock:
            return _to_cpu(self.learner.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self.lock:
            self.learner.load_state_dict(state)
            self.version += 1


def _to_cpu(value: Any) -> Any:
    """``value``'s tensors copied to the CPU, each into its own memory: a view (a flattened
    network's parameters are views of one tensor) would carry its whole storage through Ray's
    pickling, once per view."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


class _UnlockedWhileWaiting:
    """The learner's dataset, read with ``lock`` released (see :class:`LearnerNode`)."""

    def __init__(self, dataset: Iterator, lock: threading.Lock):
        object.__setattr__(self, "dataset", dataset)
        object.__setattr__(self, "lock", lock)

    def __iter__(self) -> _UnlockedWhileWaiting:
        return self

    def __next__(self) -> Any:
        self.lock.release()
        try:
            return next(self.dataset)
        finally:
            self.lock.acquire()

    def __getattr__(self, name: str) -> Any:  # ready(), close(), policy_lag, ...
        return getattr(self.dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:  # DQN sets importance_beta
        setattr(self.dataset, name, value)


class RemoteVariables:
    """A :class:`~rlherd.core.VariableSource` on another node (the learner), asked without
    waiting, as Acme's variable client does in distributed agents. One call is out at a time,
    sent at most every ``VERSION_POLL_S``: ``get_variables(names, newer_than)``, which answers
    with the learner's parameters when they are newer than the ones here, and with its version
    alone otherwise, so polling and fetching are one round trip. Only the first fetch waits;
    after it, an actor never stops acting for a round trip and acts at most one answer behind.
    ``fetched_version`` (and :meth:`variables_version`) says which version it has, so its
    variable client loads each version once.

    ``polls=False``: it sends no questions; another call carries them (:meth:`question`) and
    hands their answers in (:meth:`take`), as an on-policy actor's rollout inserts do."""

    def __init__(self, learner: Any, polls: bool = True):
        self.learner, self.polls = learner, polls
        self.fetched_version = -1
        self._names: list[str] | None = None
        self._states: list[dict[str, torch.Tensor]] | None = None
        self._asking: Any = None  # the learner's answer, asked for
        self._next_ask = 0.0
        self._arriving: tuple[int, Any] | None = None  # (version, its parameters' reference)

    def variables_version(self) -> int:
        self._look()
        return self.fetched_version

    def get_variables(self, names: list[str]) -> list[dict[str, torch.Tensor]]:
        if self._states is None:  # the first fetch waits
            self._names = names
            self.fetched_version, self._states = fetch_variables(
                self.learner.get_variables.remote(names))  # fmt: skip
        self._look()
        return self._states

    def _look(self) -> None:
        """Take the answer if it is back (and large parameters once they have arrived); ask
        again once ``VERSION_POLL_S`` has passed since the last question."""
        if self._names is None:
            return
        if self._asking is not None and ray.wait([self._asking], timeout=0)[0]:
            self.take(ray.get(self._asking))
            self._asking = None
        if self._arriving is not None and ray.wait([self._arriving[1]], timeout=0)[0]:
            version, ref = self._arriving
            self.fetched_version, self._states = version, as_tensors(ray.get(ref))
            self._arriving = None
        now = time.monotonic()
        if self.polls and self._asking is None and self._arriving is None and now >= self._next_ask:
            self._asking = self.learner.get_variables.remote(self._names, self.fetched_version)
            self._next_ask = now + VERSION_POLL_S

    def question(self) -> tuple[list[str] | None, int]:
        """``get_variables``'s arguments: the names, and the newest version here or arriving."""
        return self._names, self._arriving[0] if self._arriving else self.fetched_version

    def take(self, answer: tuple[int, list | None, Any]) -> None:
        """Take an answer of the learner's ``get_variables`` (large parameters arrive later)."""
        version, states, ref = answer
        if states is not None:
            self.fetched_version, self._states = version, as_tensors(states)
        elif ref is not None:
            self._arriving = (version, ref)


def fetch_variables(call: Any) -> tuple[int, list[dict[str, torch.Tensor]]]:
    """A learner node's ``get_variables`` call, waited for: the version, and the states as
    tensors."""
    version, states, ref = ray.get(call)
    return version, as_tensors(ray.get(ref) if states is None else states)


def as_tensors(states: list[dict[str, np.ndarray]]) -> list[dict[str, torch.Tensor]]:
    """State dicts of the learner's numpy arrays as tensors sharing their memory, which Ray
    made read-only: they are only ever copied from (``load_state_dict``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's warning about read-only arrays
        return [{k: torch.from_numpy(v) for k, v in state.items()} for state in states]


class QueueDataset:
    """On-policy batches: ``per_batch`` rollouts from the queue table, joined along the
    environment dimension as one learner batch. ``policy_lag`` is how many learner updates
    the parameters that acted them are behind (mean over the batch)."""

    def __init__(self, table: Table, per_batch: int, device: str, version: Callable):
        self.table, self.per_batch, self.device, self.version = table, per_batch, device, version
        self.policy_lag = 0.0

    def __iter__(self) -> QueueDataset:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        # Wait for a whole batch first: a sample that timed out half-way would drop rollouts.
        if not self.table.wait_until_can_sample(self.per_batch, POLL_S):
            raise RateLimiterTimeout(f"fewer than {self.per_batch} rollouts within {POLL_S}s")
        data = self.table.sample(self.per_batch).data
        self.policy_lag = float(np.mean(self.version() - data.pop(VERSION)))
        return {k: _join(torch.from_numpy(v)).to(self.device) for k, v in data.items()}


def _join(x: torch.Tensor) -> torch.Tensor:
    """``[N, A, B, ...]`` (N rollouts of B environments) -> ``[A, N * B, ...]``: every rollout
    field, recurrent state included, has the environment in dimension 1 (see ``join``)."""
    return x.transpose(0, 1).reshape(x.shape[1], -1, *x.shape[3:])


def rollout_signature(builder: Any, spec: Any, envs: int) -> dict[str, tuple]:
    """The queue table's item: one actor node's rollout (every field, ``[T + 1, envs, ...]``,
    and the recurrent state) and the version of the parameters it was acted with."""
    state = builder.make_policy(builder.make_networks(spec, "cpu")).initial_state(envs)
    layout = rollout_layout(spec, builder.rollout_fields(spec))
    buffer = allocate_rollout(layout, builder.unroll_length, envs, state)
    signature = {k: (tuple(v.shape), v.numpy().dtype) for k, v in buffer.items()}
    return dict(signature, **{VERSION: ((), np.int64)})


# ------------------------------------------------------------------------------------ actors
class Reporter(StepReport):
    """An actor node's counts (the environment loop's recorder), sent to the counter at most
    every ``STATS_PERIOD_S`` without waiting."""

    def __init__(self, counter: Any, index: int):
        super().__init__(STATS_PERIOD_S)
        self.counter, self.index = counter, index

    def send(self, steps: int, agent_steps: int, episodes: tuple[list, list, list | None]) -> None:
        self.counter.report.remote(self.index, steps, agent_steps, episodes)


class ActorNode(Node):
    """The agent's actor in an environment loop over ``envs_per_actor`` environments, acting
    with parameters from the learner node and writing to the replay node (an on-policy agent:
    to the learner node's queue), until :meth:`stop`."""

    def __init__(self, index: int, seed: int, setup: NodeSetup, replay: Any, learner: Any,
                 counter: Any):  # fmt: skip
        torch_threads(1)
        self.index, self.seed, self.setup = index, seed, setup
        self.replay, self.learner, self.counter = replay, learner, counter
        self.stopping = threading.Event()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        setup, builder = self.setup, self.setup.builder
        k = setup.settings.envs_per_actor
        reporter = Reporter(self.counter, self.index)
        on_policy = builder.dataflow != "replay"
        source = RemoteVariables(self.learner, polls=not on_policy)
        policy = builder.make_policy(builder.make_networks(setup.spec, "cpu"))
        tables: list[InsertClient] = []
        if not on_policy:
            signatures = ray.get(self.replay.signatures.remote())
            chunk = setup.settings.insert_chunk
            tables = [InsertClient(self.replay, i, signature, chunk, self.stopping)
                      for i, signature in enumerate(signatures)]  # fmt: skip
            adder = builder.make_adder(tables, k)
        else:
            per_call = setup.settings.rollouts_per_call or builder.batch_size // k
            queue = InsertClient(self.learner, 0, None, per_call, self.stopping, gather=1,
                                 variables=source)

            def hand_over(full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
                acted_with = source.fetched_version
                # A copy: it may wait here for the next rollout while ``full`` is refilled.
                rollout = {name: v.numpy().copy() for name, v in full.items()}
                queue.insert({**rollout, VERSION: acted_with})
                return full

            layout = rollout_layout(setup.spec, builder.rollout_fields(setup.spec))
            buffer = allocate_rollout(layout, builder.unroll_length, k, policy.initial_state(k))
            adder = RolloutWriter(buffer, hand_over)
        actor = builder.make_actor(self.seed, policy, setup.spec, adder, source)
        actor.update(wait=True)
        envs = make_envs(setup.env_id, setup.env_kwargs, setup.settings, k)
        try:
            loop = EnvironmentLoop(envs, actor, reporter, self.seed)
            while not self.stopping.is_set():
                loop.step()
                reporter.report()
                if on_policy:
                    queue.poll()
        except Stopped:
            pass
        finally:
            envs.close()


# --------------------------------------------------------------------------------- evaluator
class EvaluatorNode(Node):
    """The greedy policy's episodes, with the learner node's latest parameters (fetched when an
    evaluation starts, and waited for); it has no adder, so it never writes to replay."""

    @keeps_errors
    def __init__(self, setup: NodeSetup, episodes: int, seed: int, learner: Any):
        torch_threads(1)
        self.play = EvalEpisodes(setup.builder, setup.spec, setup.env_id, setup.env_kwargs,
                                 episodes, seed)  # fmt: skip
        self.learner = learner

    def get_variables(self, names: list[str]) -> list[dict[str, torch.Tensor]]:
        return fetch_variables(self.learner.get_variables.remote(names))[1]

    def evaluate(self) -> dict[str, float]:
        return self.play(self)  # the evaluator is its own (waiting) variable source

    def evaluated_policy(self) -> dict[str, Any]:
        """The parameters the latest evaluation played with (for the run's callbacks)."""
        return {k: v.numpy() for k, v in self.play.net.state_dict().items()}
