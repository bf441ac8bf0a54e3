"""Several policies in one game: :class:`PolicyGroups` is the agent's builder once per policy,
presented to the runtimes as one builder.

A multi-agent game is a vector environment whose rows are its agents, game by game (see
:mod:`rlherd.envs.pettingzoo`), so row ``r`` is agent ``r % n`` of its game, and the run's policy
mapping (``EnvSpec.policies``: the policy of each agent) says whose row it is. Each policy gets
what the device runtime's agent groups get: the agent's builder with that policy's
``policy_overrides``, its own networks, its own actor and its own learner (RLlib's and TorchRL's
"one policy per group"). Nothing of a runtime changes:

- on-policy agents: each policy's actor acts on its rows; their rows are gathered into the one
  rollout the runtime owns (:class:`Gather`), and the learner splits every batch by columns, one
  share per policy's learner. A batch is made of whole games (a rollout holds an actor's
  environments, a multiple of the game's agents), so column ``c`` is agent ``c % n``.
- replay agents: each policy has its own tables, adders and dataset, so each learns from its own
  agents' transitions only (independent learners), each paced by its own rate limiter.
- a runtime that acts through a stand-in of its own (poly's dynamic batcher, which runs the
  whole policy on every actor's rows at once): each policy's actor labels its rows
  (:class:`Labelled`), and the whole acts on each row with the policy its label names.

The whole is one network (a :class:`torch.nn.ModuleDict` by policy name), so checkpoints,
parameter sharing with actors (shared memory, Ray) and evaluation handle it as any agent's.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from rlherd import types as F
from rlherd.config import apply_overrides
from rlherd.core import POLICY_KEY, EnvSpec, VariableClient
from rlherd.errors import ConfigError
from rlherd.replay.table import RateLimiterTimeout


class Rows:
    """Which rows of a batch are each policy's: row ``r`` is agent ``r % n`` of its game, and
    ``agent_policy[a]`` is the index of agent ``a``'s policy."""

    def __init__(self, agent_policy: list[int], policies: int):
        self.agent_policy, self.policies = np.asarray(agent_policy), policies
        self._index: dict[int, list[torch.Tensor]] = {}

    def index(self, rows: int) -> list[torch.Tensor]:
        """For each policy, its rows among ``rows`` (a multiple of the game's agents)."""
        if rows not in self._index:
            n = len(self.agent_policy)
            if rows % n:
                raise ConfigError(f"{rows} environments (rows) are not whole games of {n} "
                                  f"agents: set --num-envs (or --envs-per-actor) to a multiple "
                                  f"of {n}, e.g. {n * max(1, rows // n)}")  # fmt: skip
            policy = np.tile(self.agent_policy, rows // n)
            self._index[rows] = [torch.as_tensor(np.flatnonzero(policy == k))
                                 for k in range(self.policies)]  # fmt: skip
        return self._index[rows]

    def split(self, x: Any, dim: int = 0) -> list[Any]:
        """``x`` (an array, a tensor, or a dict or tuple of them) as each policy's rows."""
        first = x
        while isinstance(first, dict | tuple):
            first = next(iter(first.values())) if isinstance(first, dict) else first[0]
        return [_take(x, i, dim) for i in self.index(first.shape[dim])]

    def join(self, parts: list[Any], dim: int = 0) -> Any:
        """The inverse of :meth:`split`: each policy's rows back in their places."""
        first = parts[0]
        if isinstance(first, dict):
            return {k: self.join([p[k] for p in parts], dim) for k in first}
        if isinstance(first, tuple):
            return tuple(self.join([p[i] for p in parts], dim) for i in range(len(first)))
        index = self.index(sum(p.shape[dim] for p in parts))
        if isinstance(first, np.ndarray):
            out = np.empty((sum(len(i) for i in index), *first.shape[1:]), first.dtype)
            for i, p in zip(index, parts, strict=True):
                out[i.numpy()] = p
            return out
        shape = list(first.shape)
        shape[dim] = sum(p.shape[dim] for p in parts)
        out = first.new_empty(shape)
        for i, p in zip(index, parts, strict=True):
            out.index_copy_(dim, i.to(out.device), p)
        return out


def _take(x: Any, index: torch.Tensor, dim: int) -> Any:
    if isinstance(x, dict):
        return {k: _take(v, index, dim) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_take(v, index, dim) for v in x)
    if isinstance(x, np.ndarray):
        return x[index.numpy()]
    return x.index_select(dim, index.to(x.device))


class GroupPolicy:
    """A :class:`~rlherd.core.Policy` whose rows are acted on by each policy's own; ``net`` is
    the whole (what an actor's variable client keeps up to date)."""

    def __init__(self, policies: dict[str, Any], rows: Rows, net: torch.nn.ModuleDict):
        self.policies, self.rows, self.net = policies, rows, net
        first = next(iter(policies.values()))
        self.device, self.greedy = first.device, getattr(first, "greedy", True)

    def initial_state(self, batch_size: int) -> tuple:
        index = self.rows.index(batch_size)
        parts = [p.initial_state(len(i)) for p, i in zip(self.policies.values(), index,
                                                           strict=True)]  # fmt: skip
        return self.rows.join(parts, dim=1) if parts[0] else ()

    def __call__(self, obs, first, state, generator):
        if isinstance(obs, dict) and POLICY_FIELD in obs:  # each row says whose it is
            return self._by_label(obs, first, state, generator)
        obs_parts, first_parts = self.rows.split(obs), self.rows.split(first)
        state_parts = self.rows.split(state, dim=1) if state else [()] * len(self.policies)
        outputs, states = [], []
        for policy, o, f, s in zip(self.policies.values(), obs_parts, first_parts, state_parts,
                                   strict=True):  # fmt: skip
            out, new = policy(o, f, s, generator)
            outputs.append(out)
            states.append(new)
        return self.rows.join(outputs), self.rows.join(states, dim=1) if states[0] else ()

    def _by_label(self, obs, first, state, generator):
        """Rows from several actors at once (poly's batcher), each labelled with its policy by
        :class:`Labelled`: each policy acts on its rows, wherever they are."""
        obs = dict(obs)
        labels = obs.pop(POLICY_FIELD).long()
        if set(obs) == {INNER}:
            obs = obs[INNER]
        rows = len(labels)
        outputs: dict[str, torch.Tensor] = {}
        new_state: list[Any] = [None] * len(state)
        for k, policy in enumerate(self.policies.values()):
            index = torch.nonzero(labels == k).flatten()
            if len(index) == 0:
                continue
            sub_state = tuple(s.index_select(1, index.to(s.device)) for s in state)
            out, new = policy(_take(obs, index, 0), first[index.to(first.device)], sub_state,
                              generator)  # fmt: skip
            for key, v in out.items():
                if key not in outputs:
                    outputs[key] = v.new_empty((rows, *v.shape[1:]))
                outputs[key].index_copy_(0, index.to(v.device), v)
            for j, s in enumerate(new):
                if new_state[j] is None:
                    new_state[j] = s.new_empty((s.shape[0], rows, *s.shape[2:]))
                new_state[j].index_copy_(1, index.to(s.device), s)
        return outputs, tuple(new_state)


POLICY_FIELD, INNER = "policy_of_row", "inner"  # a labelled observation's fields


class Labelled:
    """Policy ``k``'s actor's policy where a runtime acts through a stand-in of its own (poly's
    batched policy, which runs the whole :class:`GroupPolicy` on every actor's rows at once):
    each row goes with its policy's index, so the whole knows whose it is."""

    def __init__(self, policy: Any, k: int, initial_state: Any):
        self.policy, self.k, self.initial_state = policy, k, initial_state
        self.device = getattr(policy, "device", torch.device("cpu"))
        self.greedy = getattr(policy, "greedy", False)

    def __call__(self, obs, first, state, generator):
        labels = torch.full((F.obs_len(obs),), self.k, dtype=torch.int64)
        labelled = {**obs} if isinstance(obs, dict) else {INNER: obs}
        return self.policy({**labelled, POLICY_FIELD: labels}, first, state, generator)


class Gather:
    """The runtime's one rollout writer, written by every policy's actor: each writes its rows
    (``part(k)``), and once all have, the whole row goes to the writer."""

    def __init__(self, writer: Any, rows: Rows):
        self.writer, self.rows = writer, rows
        self._rows: list[Any] = [None] * rows.policies
        self._outcomes: list[Any] = [None] * rows.policies

    def part(self, k: int) -> _Part:
        return _Part(self, k)

    def add_row(self, k: int, core_state: tuple, values: dict) -> None:
        self._rows[k] = (core_state, values)
        if all(r is not None for r in self._rows):
            states = [s for s, _ in self._rows]
            state = self.rows.join(states, dim=1) if states[0] else ()
            self.writer.add_row(core_state=state, **self.rows.join([v for _, v in self._rows]))
            self._rows = [None] * self.rows.policies

    def add_outcome(self, k: int, outcome: tuple) -> None:
        self._outcomes[k] = outcome
        if all(o is not None for o in self._outcomes):
            self.writer.add_outcome(*self.rows.join(self._outcomes))
            self._outcomes = [None] * self.rows.policies


class _Part:
    """One policy's actor's rollout writer (see :class:`Gather`; the whole writer's state is
    checkpointed once, by :class:`GroupActor`)."""

    def __init__(self, gather: Gather, k: int):
        self.gather, self.k = gather, k

    def add_row(self, core_state: tuple = (), **values: torch.Tensor) -> bool:
        self.gather.add_row(self.k, core_state, values)
        return False

    def add_outcome(self, reward, terminated, truncated, skip=None) -> None:
        self.gather.add_outcome(self.k, (reward, terminated, truncated, skip))

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: None) -> None:
        pass


class GroupActor:
    """An :class:`~rlherd.core.Actor` made of each policy's actor, each acting on its rows, and
    one variable client for all of their networks."""

    def __init__(self, actors: dict[str, Any], rows: Rows, client: VariableClient | None,
                 writer: Any = None):  # fmt: skip
        self.actors, self.rows, self.client, self.writer = actors, rows, client, writer
        self.names = list(actors)

    def row_policies(self, rows: int) -> list[str]:
        """The policy of each of ``rows`` rows (the environment loop's per-policy returns)."""
        names = np.empty(rows, dtype=object)
        for name, index in zip(self.names, self.rows.index(rows), strict=True):
            names[index.numpy()] = name
        return names.tolist()

    def select_action(self, obs: np.ndarray) -> np.ndarray:
        parts = self.rows.split(obs)
        return self.rows.join([a.select_action(o) for a, o in zip(self.actors.values(), parts,
                                                                  strict=True)])  # fmt: skip

    def observe_first(self, obs: np.ndarray, envs: np.ndarray) -> None:
        for a, o, e in zip(self.actors.values(), self.rows.split(obs),
                           self.rows.split(np.asarray(envs)), strict=True):  # fmt: skip
            a.observe_first(o, e)

    def observe(self, action, reward, next_obs, terminated, truncated, skip, extras=None) -> None:
        columns = [np.asarray(x) for x in (action, reward, terminated, truncated, skip)]
        parts = zip(*(self.rows.split(x) for x in columns), strict=True)
        obs_parts = self.rows.split(next_obs)
        extra_parts = self.rows.split(extras) if extras else [None] * len(self.actors)
        for a, (act, r, term, trunc, s), o, e in zip(self.actors.values(), parts, obs_parts,
                                                    extra_parts, strict=True):  # fmt: skip
            a.observe(act, r, o, term, trunc, s, e)

    def update(self, wait: bool = False) -> None:
        if self.client is not None:
            self.client.update(wait)

    def state_dict(self) -> dict[str, Any]:
        writer = self.writer.state_dict() if self.writer is not None else None
        return dict(writer=writer, policies={name: a.state_dict()
                                             for name, a in self.actors.items()})  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.writer is not None:
            self.writer.load_state_dict(state["writer"])
        for name, a in self.actors.items():
            a.load_state_dict(state["policies"][name])


class Feed:
    """A learner's dataset that yields what it was last handed (a policy's share of a batch)."""

    def __init__(self) -> None:
        self.item: Any = None

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        item, self.item = self.item, None
        return item


class GroupDataset:
    """Each policy's replay dataset; a batch is ready when one of theirs is."""

    def __init__(self, datasets: dict[str, Any]):
        self.datasets = datasets

    def ready(self) -> bool:
        return any(d.ready() for d in self.datasets.values())

    def close(self) -> None:
        for d in self.datasets.values():
            if hasattr(d, "close"):
                d.close()


class GroupLearner:
    """Each policy's learner as one :class:`~rlherd.core.Learner`. On-policy: one ``step()``
    takes the runtime's next batch and steps every policy's learner on its columns. Replay:
    it steps the learners whose tables can be sampled (none yet: a timeout after a short wait,
    which runtimes treat as "wait for actors"). Metrics carry the policy's name as a suffix
    (``policy_loss_adversary``), as the device runtime's do."""

    def __init__(self, learners: dict[str, Any], networks: torch.nn.ModuleDict, rows: Rows,
                 dataset: Any = None, feeds: dict[str, Feed] | None = None,
                 datasets: dict[str, Any] | None = None):  # fmt: skip
        self.learners, self.net, self.rows = learners, networks, rows
        self.dataset, self.feeds, self.datasets = dataset, feeds, datasets

    def step(self) -> dict[str, Any]:
        if self.dataset is not None:
            batch = next(self.dataset)
            for feed, share in zip(self.feeds.values(), self.rows.split(batch, dim=1),
                                   strict=True):  # fmt: skip
                feed.item = share
            stepping = list(self.learners)
        else:
            stepping = [name for name, d in self.datasets.items() if d.ready()]
            if not stepping:
                time.sleep(0.01)
                raise RateLimiterTimeout("no policy's table can be sampled yet")
        metrics: dict[str, Any] = {}
        for name in stepping:
            metrics.update({f"{k}_{name}": v for k, v in self.learners[name].step().items()})
        return metrics

    @property
    def num_steps(self) -> int:
        """Steps of the whole: on-policy, every policy's learner steps on every batch (one
        count); replay learners step apart, and any one's step changes the parameters."""
        steps = [learner.num_steps for learner in self.learners.values()]
        return steps[0] if self.dataset is not None else sum(steps)

    def variables_version(self) -> int:
        return self.num_steps

    def policy_state(self) -> dict[str, Any]:
        return self.net.state_dict()

    def get_variables(self, names: list[str]) -> list[dict[str, Any]]:
        return [self.policy_state() for _ in names]

    def check_divergence(self) -> None:
        for learner in self.learners.values():
            learner.check_divergence()

    def state_dict(self) -> dict[str, Any]:
        """The whole network under :data:`~rlherd.core.POLICY_KEY` (what evaluation loads),
        and the rest of each policy's learner under its name."""
        rest = {name: {k: v for k, v in learner.state_dict().items() if k != POLICY_KEY}
                for name, learner in self.learners.items()}  # fmt: skip
        return {POLICY_KEY: self.policy_state(), "policies": rest}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, learner in self.learners.items():
            prefix = f"{name}."
            net = {k[len(prefix):]: v for k, v in state[POLICY_KEY].items()
                   if k.startswith(prefix)}  # fmt: skip
            learner.load_state_dict({POLICY_KEY: net, **state["policies"][name]})


class PolicyGroups:
    """The builder of a run whose game has several policies (see the module docstring). It
    answers every builder question the agent's own builder answers (``name``, ``dataflow``,
    ``unroll_length``, ...) by asking it, and makes each part once per policy.

    Example::

        spec = dataclasses.replace(spec, policies=("adversary",) * 3 + ("agent",))
        builder = PolicyGroups(PPOBuilder(config), spec, {"agent": {"learning_rate": 1e-3}})
    """

    def __init__(self, builder: Any, spec: EnvSpec, overrides: dict[str, dict[str, Any]]):
        self.base = builder
        self.names = list(dict.fromkeys(spec.policies))
        unknown = set(overrides) - set(self.names)
        if unknown:
            raise ConfigError(f"policy_overrides names {sorted(unknown)}, but the run's "
                              f"policies are {self.names}")  # fmt: skip
        self.builders = {}
        for name in self.names:
            b = copy.copy(builder)
            b.config = apply_overrides(builder.config, overrides.get(name, {}))
            self.builders[name] = b
        self.rows = Rows([self.names.index(p) for p in spec.policies], len(self.names))
        if builder.dataflow == "rollout":
            self._check_shared_rollouts(spec, overrides)

    def _check_shared_rollouts(self, spec: EnvSpec, overrides: dict[str, dict[str, Any]]) -> None:
        """On-policy runs write every policy's rows into the runtime's one rollout, so an
        override may not change its shape (lengths, fields, the recurrent state): one line
        naming the policy, rather than a shape error deep in a join."""
        def shape(b: Any) -> tuple:
            state = b.make_policy(b.make_networks(spec)).initial_state(1)
            return (b.unroll_length, b.batch_size, b.rollout_fields(spec),
                    tuple(s.shape for s in state))  # fmt: skip

        with torch.random.fork_rng():  # building networks must not shift the run's RNG
            reference = shape(self.base)
            for name in overrides:
                if shape(self.builders[name]) != reference:
                    raise ConfigError(
                        f"policy_overrides[{name!r}] ({overrides[name]}) changes the rollouts "
                        "every policy of this on-policy run shares (unroll_length, batch_size, "
                        "the recurrent state); override what leaves them alone (learning "
                        "rates, loss coefficients), or use a replay agent"
                    )

    def __getattr__(self, name: str) -> Any:
        # Everything not made per policy is the agent's own (its name, dataflow, lengths).
        base = self.__dict__.get("base")
        if base is None:  # being unpickled: nothing is set yet
            raise AttributeError(name)
        return getattr(base, name)

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> torch.nn.ModuleDict:
        return torch.nn.ModuleDict(
            {name: b.make_networks(spec, device) for name, b in self.builders.items()}
        )

    def make_policy(self, networks: torch.nn.ModuleDict, evaluation: bool = False) -> GroupPolicy:
        policies = {name: b.make_policy(networks[name], evaluation=evaluation)
                    for name, b in self.builders.items()}  # fmt: skip
        return GroupPolicy(policies, self.rows, networks)

    # ---------------------------------------------------------------- replay agents
    def make_replay_tables(self, spec: EnvSpec, insert_blocking: bool = True,
                           dataset_size: int | None = None) -> list:  # fmt: skip
        tables = []
        for name, b in self.builders.items():
            for table in b.make_replay_tables(spec, insert_blocking, dataset_size):
                table.name = f"{name}/{table.name}"
                tables.append(table)
        return tables

    def _tables(self, tables: list) -> dict[str, list]:
        """The flat list of tables (or their remote handles), by policy: each has as many."""
        per = len(tables) // len(self.names)
        return {name: tables[i * per:(i + 1) * per] for i, name in enumerate(self.names)}

    def make_dataset(self, tables: list, device: str = "cpu") -> GroupDataset:
        return GroupDataset({name: self.builders[name].make_dataset(t, device)
                             for name, t in self._tables(tables).items()})  # fmt: skip

    def make_adder(self, tables: list, num_envs: int) -> dict[str, Any]:
        counts = [len(i) for i in self.rows.index(num_envs)]
        return {name: self.builders[name].make_adder(t, n)
                for (name, t), n in zip(self._tables(tables).items(), counts, strict=True)}

    # ---------------------------------------------------------------- both
    def make_actor(self, seed: int, policy: Any, spec: EnvSpec, adder: Any,
                   variable_source: Any) -> GroupActor:  # fmt: skip
        """Each policy's actor, on its own random stream; an on-policy runtime's writer is
        shared through a :class:`Gather`, a replay runtime's adders are already per policy.
        ``policy`` is :meth:`make_policy`'s, or a runtime's stand-in for it (each policy's
        actor then acts through it, its rows :class:`Labelled`)."""
        policies = getattr(policy, "policies", None)
        if not isinstance(policy, GroupPolicy):
            policies = {}
            for k, (name, b) in enumerate(self.builders.items()):
                with torch.random.fork_rng():  # a network only for its recurrent state's shape
                    own = b.make_policy(b.make_networks(spec))
                policies[name] = Labelled(policy, k, own.initial_state)
        gather = None
        if adder is not None and self.base.dataflow == "rollout":
            gather = Gather(adder, self.rows)
        actors = {}
        for k, (name, b) in enumerate(self.builders.items()):
            part = adder[name] if isinstance(adder, dict) else None
            if gather is not None:
                part = gather.part(k)
            actors[name] = b.make_actor(seed + 104729 * k, policies[name], spec, part, None)
        client = None
        if variable_source is not None and isinstance(policy, GroupPolicy):
            period = getattr(self.base.config, "variable_update_period", 1)
            client = VariableClient(variable_source, policy.net, "policy", period)
        return GroupActor(actors, self.rows, client, adder if gather is not None else None)

    def make_learner(self, networks: torch.nn.ModuleDict, dataset: Any, total_steps: int,
                     tables: list | None = None) -> GroupLearner:  # fmt: skip
        """Each policy's learner, its budget (``total_steps``: rows of the whole run) its
        agents' share of the rows."""
        agents = np.bincount(self.rows.agent_policy, minlength=len(self.names))
        budget = {name: max(1, total_steps * int(agents[k]) // len(self.rows.agent_policy))
                  for k, name in enumerate(self.names)}  # fmt: skip
        if self.base.dataflow == "rollout":
            feeds = {name: Feed() for name in self.names}
            learners = {name: b.make_learner(networks[name], feeds[name], budget[name])
                        for name, b in self.builders.items()}  # fmt: skip
            return GroupLearner(learners, networks, self.rows, dataset=dataset, feeds=feeds)
        per_table = self._tables(tables or [])
        learners = {
            name: b.make_learner(networks[name], dataset.datasets[name], budget[name],
                                 per_table[name])
            for name, b in self.builders.items()
        }
        return GroupLearner(learners, networks, self.rows, datasets=dataset.datasets)


def for_policies(builder: Any, spec: EnvSpec | None, overrides: dict[str, dict[str, Any]],
                 demonstrations: str = "") -> Any:  # fmt: skip
    """The builder a run uses: the agent's own where its game has one policy (with that
    policy's overrides), else :class:`PolicyGroups`. (The device runtime, whose runs have no
    spec here, makes its groups itself.)"""
    names = list(dict.fromkeys(spec.policies)) if spec is not None else []
    if len(names) > 1:
        if demonstrations:
            raise ConfigError("demonstrations are one policy's: a game of several policies "
                              "cannot mix them in; drop --demonstrations")  # fmt: skip
        return PolicyGroups(builder, spec, overrides)
    if spec is None:
        return builder
    unknown = set(overrides) - set(names)
    if unknown:
        raise ConfigError(f"policy_overrides names {sorted(unknown)}, but the run has one "
                          f"policy{f' ({names[0]})' if names else ''}")  # fmt: skip
    if names and overrides:
        builder = copy.copy(builder)
        builder.config = apply_overrides(builder.config, overrides[names[0]])
    return builder
