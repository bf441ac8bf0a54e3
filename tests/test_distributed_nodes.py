"""The distributed runtime's nodes, a few at a time, on one local Ray that the module's tests
share (whole programs, which start their own, are in tests/test_distributed.py): how parameters
are published and fetched, how inserts and rollouts travel; and a whole program on a Ray that
its script started itself."""

import functools
import itertools
import threading
import time

import numpy as np
import pytest

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray for the module's tests, started once: each test's nodes are its own, and it
    kills those it keeps (starting Ray takes seconds, a test of nodes a few more)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def test_large_parameters_are_published_once_per_version_and_small_ones_sent_in_the_answer(
    local_ray,
):
    from rlherd import envs as rl_envs
    from rlherd.agents import BUILDERS
    from rlherd.runtime.program import (
        PUBLISH_BYTES,
        LearnerNode,
        NodeSetup,
        ReplayNode,
        fetch_variables,
    )
    from rlherd.runtime.settings import Distributed

    spec = rl_envs.spec_for("CartPole-v1")
    for hidden, published in (((16,), False), ((1024, 1024), True)):
        builder = BUILDERS["dqn"](BUILDERS["dqn"].config_class(hidden_sizes=hidden))
        tables = functools.partial(builder.make_replay_tables, spec, True)
        replay = local_ray.remote(ReplayNode).remote(tables)
        setup = NodeSetup(builder, spec, "CartPole-v1", {}, Distributed(), 0)
        node = local_ray.remote(LearnerNode).options(max_concurrency=4).remote(setup, replay, 10, 0)
        local_ray.get(node.ready.remote())
        answers = [local_ray.get(node.get_variables.remote(["policy"])) for _ in range(2)]
        assert [answer[1] is None for answer in answers] == [published] * 2
        if published:  # one put for the version, however many ask
            assert answers[0][2] == answers[1][2]
        else:
            for a, b in zip(answers[0][1][0].values(), answers[1][1][0].values(), strict=True):
                np.testing.assert_array_equal(a, b)
        version = answers[0][0]  # an asker that has it gets the version alone
        newer = node.get_variables.remote(["policy"], version)
        assert local_ray.get(newer) == (version, None, None)
        _, (state,) = fetch_variables(node.get_variables.remote(["policy"]))
        assert (sum(v.nbytes for v in state.values()) >= PUBLISH_BYTES) == published
        local_ray.kill(node)
        local_ray.kill(replay)


def test_the_learner_node_starts_from_the_runs_seed_as_a_single_run_does(local_ray):
    """A node's process starts with torch's own random seed; the learner's networks are made from
    the run's: two runs of one seed start from the same parameters, those a single run of that
    seed starts from, and another seed's differ. (Without it, R2D2's distributed runs on
    Corridor with seed 0 started from a different network each time, and some never left
    the first cell.)"""
    from rlherd import envs as rl_envs
    from rlherd.agents import BUILDERS
    from rlherd.runtime import seed_everything
    from rlherd.runtime.program import LearnerNode, NodeSetup, ReplayNode, fetch_variables
    from rlherd.runtime.settings import Distributed

    spec = rl_envs.spec_for("CartPole-v1")
    builder = BUILDERS["dqn"](BUILDERS["dqn"].config_class(hidden_sizes=(16,)))
    tables = functools.partial(builder.make_replay_tables, spec, True)
    replay = local_ray.remote(ReplayNode).remote(tables)

    def first_parameters(seed: int) -> dict[str, np.ndarray]:
        setup = NodeSetup(builder, spec, "CartPole-v1", {}, Distributed(), seed)
        node = local_ray.remote(LearnerNode).options(max_concurrency=4).remote(setup, replay, 10, 0)
        _, (state,) = fetch_variables(node.get_variables.remote(["policy"]))
        local_ray.kill(node)
        return state

    seed_everything(0)
    single = {k: v.numpy() for k, v in builder.make_networks(spec, "cpu").state_dict().items()}
    runs = [first_parameters(0), first_parameters(0), first_parameters(1)]
    local_ray.kill(replay)
    for run in runs[:2]:
        assert run.keys() == single.keys()
        for name, value in single.items():
            np.testing.assert_array_equal(run[name], value)
    assert any(not np.array_equal(runs[2][k], single[k]) for k in single)


def test_insert_calls_gather_the_chunks_made_while_a_call_is_out(local_ray):
    """An actor that makes chunks faster than calls come back sends them together (up to
    ``gather`` chunks, fewer for large items, and no more than the table's rate limiter said
    it would take); one that waits for each call sends chunks alone; a queue of rollouts
    (``gather=1``) never gathers."""
    from rlherd.runtime.program import GATHER_BYTES, InsertClient

    @local_ray.remote
    class Replay:
        def __init__(self):
            self.calls, self.delay, self.room = [], 0.0, 10**6

        def slow(self, delay: float, room: int = 10**6) -> None:
            self.delay, self.room = delay, room

        def insert(self, index, columns, priorities, timeout, most):
            time.sleep(self.delay)
            self.calls.append(len(priorities))
            return len(priorities), min(self.room, most)

        def log(self) -> list[int]:
            calls, self.calls = self.calls, []
            return calls

    def sent(client: InsertClient, chunks: int, wait: bool, size: int = 1) -> list[int]:
        for _ in range(chunks * client.chunk):
            client.insert({"x": np.zeros(size, np.float32)})
            if wait and client.in_flight is not None:
                local_ray.wait([client.in_flight[0]])
        client.settle()
        return local_ray.get(replay.log.remote())

    replay, stop = Replay.remote(), threading.Event()
    local_ray.get(replay.slow.remote(0.3))
    # The first answer says how much the table takes: until it is back, chunks go alone.
    assert sent(InsertClient(replay, 0, None, 4, stop, gather=3), 8, wait=False) == [4, 4, 12, 12]
    assert sent(InsertClient(replay, 0, None, 4, stop, gather=1), 3, wait=False) == [4, 4, 4]
    local_ray.get(replay.slow.remote(0.0))
    assert sent(InsertClient(replay, 0, None, 4, stop, gather=3), 3, wait=True) == [4, 4, 4]
    big = GATHER_BYTES // 4 // 2  # float32s: two items fill GATHER_BYTES
    local_ray.get(replay.slow.remote(0.3))
    assert sent(InsertClient(replay, 0, None, 1, stop, gather=3), 4, False, big) == [1, 1, 2]
    local_ray.get(replay.slow.remote(0.3, room=0))  # a learner behind: the limiter holds back
    assert sent(InsertClient(replay, 0, None, 4, stop, gather=3), 3, wait=False) == [4, 4, 4]
    local_ray.get(replay.slow.remote(0.3, room=5))  # room for 5: two chunks, not three
    assert sent(InsertClient(replay, 0, None, 4, stop, gather=3), 6, wait=False) == [4, 4, 8, 8]


def test_actors_poll_and_fetch_parameters_in_one_call_that_carries_them_only_when_newer(local_ray):
    """An actor node's source asks ``get_variables(names, newer_than)`` and nothing else (a
    separate version poll would double the calls to the learner), gets parameters only for a
    newer version, and loads that version once it is back."""
    from rlherd.runtime.program import RemoteVariables

    @local_ray.remote
    class Learner:  # no variables_version: a client that polls it fails
        def __init__(self):
            self.version, self.asked = 0, []

        def step(self) -> None:
            self.version += 1

        def get_variables(self, names, newer_than=-1):
            self.asked.append((self.version, newer_than))
            if self.version <= newer_than:
                return self.version, None, None
            return self.version, [{"w": np.full(1, float(self.version), np.float32)}], None

        def log(self) -> list[tuple[int, int]]:
            return self.asked

    def poll_until(version: int) -> None:
        deadline = time.monotonic() + 10
        while source.variables_version() != version and time.monotonic() < deadline:
            time.sleep(0.005)

    learner = Learner.remote()
    source = RemoteVariables(learner)
    assert source.get_variables(["policy"])[0]["w"].item() == 0.0  # the first fetch waits
    for _ in range(20):
        poll_until(0)
    local_ray.get(learner.step.remote())
    poll_until(1)
    assert source.get_variables(["policy"])[0]["w"].item() == 1.0
    asked = local_ray.get(learner.log.remote())  # (the learner's version, newer_than)
    assert asked[0] == (0, -1) and (0, 0) in asked and (1, 0) in asked
    assert sum(version > newer_than for version, newer_than in asked) == 2  # sent twice


def _cartpole_on_policy_program(ray, learner_cls: type, settings, capacity: int) -> tuple:
    """IMPALA on CartPole (rollouts of 5 steps, batches of 4 environments) as one actor node and
    a learner node of ``learner_cls`` whose queue holds ``capacity`` rollouts: (learner, actor,
    counter), the counter's handle kept so that Ray keeps it."""
    from rlherd import envs as rl_envs
    from rlherd.agents import BUILDERS
    from rlherd.runtime.distributed import _queue_table
    from rlherd.runtime.node import CounterNode
    from rlherd.runtime.program import ActorNode, NodeSetup, rollout_signature

    spec = rl_envs.spec_for("CartPole-v1")
    builder = BUILDERS["impala"](BUILDERS["impala"].config_class(unroll_length=5, batch_size=4))
    setup = NodeSetup(builder, spec, "CartPole-v1", {}, settings, 0)
    k = settings.envs_per_actor
    queue = functools.partial(_queue_table, rollout_signature(builder, spec, k), capacity)
    learner = ray.remote(learner_cls).options(max_concurrency=4).remote(
        setup, None, 10**6, builder.batch_size // k, queue)  # fmt: skip
    counter = ray.remote(CounterNode).remote()
    actor = ray.remote(ActorNode).options(max_concurrency=2).remote(
        0, 0, setup, None, learner, counter)  # fmt: skip
    return learner, actor, counter


def test_an_on_policy_actor_node_polls_for_parameters_with_its_rollouts_alone(local_ray):
    """Rollouts go into the learner node's own queue, and each insert's answer carries the
    parameters when they are newer: the actor node makes no call of its own to poll (on two
    cores, polls as often cost IMPALA on CartPole a fifth of its speed) and still acts with
    fresh parameters (the learner's batches are a few versions old at most)."""
    from rlherd.runtime.program import LearnerNode
    from rlherd.runtime.settings import Distributed

    class Learner(LearnerNode):  # counts the calls that reach it
        def get_variables(self, names, newer_than=-1):
            self.calls = getattr(self, "calls", 0) + 1
            return super().get_variables(names, newer_than)

        def insert_and_get_variables(self, *args):
            self.inserts = getattr(self, "inserts", 0) + 1
            return super().insert_and_get_variables(*args)

        def count(self) -> tuple[int, int]:
            inserts = getattr(self, "inserts", 0)  # each one's get_variables counts in calls
            return inserts, getattr(self, "calls", 0) - inserts

    settings = Distributed(envs_per_actor=2, rollouts_per_call=1)
    learner, actor, _ = _cartpole_on_policy_program(local_ray, Learner, settings, capacity=4)
    run = actor.run.remote()
    lags = []
    for _ in range(20):
        steps, metrics = local_ray.get(learner.train.remote(0.2))
        if steps:
            lags.append(metrics["policy_lag"])
    actor.stop.remote()
    local_ray.get(run)
    local_ray.get(learner.train.remote(1.0))  # makes room for an insert still out, so it ends
    inserts, polls = local_ray.get(learner.count.remote())
    assert inserts >= 20 and polls == 1, (inserts, polls)  # one poll: the first fetch waits
    assert len(lags) >= 5 and np.mean(lags[len(lags) // 2 :]) < 4, lags


@pytest.mark.parametrize("per_call", [0, 1])
def test_an_on_policy_actor_node_sends_whole_distinct_rollouts_a_batch_per_call(
    local_ray, per_call
):
    """Each insert call carries ``rollouts_per_call`` rollouts, by default one learner batch's
    worth (here 2 of 2 environments for a batch of 4): half the calls, each with its Ray cost,
    for IMPALA's short CartPole rollouts. The rollouts in a call are consecutive and each its
    own: the first waits for the second while the actor's buffer is refilled, so it must be a
    copy (a view would send the second rollout twice)."""
    from rlherd import types as F
    from rlherd.runtime.program import LearnerNode
    from rlherd.runtime.settings import Distributed

    class Learner(LearnerNode):  # keeps the first calls' observations
        def insert_and_get_variables(self, index, columns, *rest):
            self.sent = getattr(self, "sent", [])
            if len(self.sent) < 8:
                self.sent.append(np.array(columns[F.OBS]))
            return super().insert_and_get_variables(index, columns, *rest)

        def calls(self) -> list[np.ndarray]:
            return getattr(self, "sent", [])

    settings = Distributed(envs_per_actor=2, rollouts_per_call=per_call)
    # Room for all 8 calls' rollouts: a full queue would take a call in part and resend the rest.
    learner, actor, _ = _cartpole_on_policy_program(local_ray, Learner, settings, capacity=16)
    run = actor.run.remote()
    deadline = time.monotonic() + 60
    while len(local_ray.get(learner.calls.remote())) < 8 and time.monotonic() < deadline:
        local_ray.get(learner.train.remote(0.2))
    actor.stop.remote()
    local_ray.get(learner.train.remote(1.0))  # makes room for an insert still out, so it ends
    local_ray.get(run)
    calls = local_ray.get(learner.calls.remote())
    assert len(calls) == 8
    rollouts = [rollout for call in calls for rollout in call]  # each [T + 1, envs, 4]
    assert {len(call) for call in calls} == {per_call or 2}
    for before, after in itertools.pairwise(rollouts):
        np.testing.assert_array_equal(before[-1], after[0])  # row T carries over
        assert not np.array_equal(before[0], after[0])


def test_parameters_that_come_back_with_a_rollout_act_from_the_next_step(local_ray):
    """An on-policy actor's insert call brings newer parameters; ``poll()`` (every step) takes
    them as soon as the call is back, not when the next rollout is sent."""
    from rlherd.runtime.program import InsertClient, RemoteVariables

    @local_ray.remote
    class Learner:
        def __init__(self):
            self.version = 0

        def get_variables(self, names, newer_than=-1):
            if self.version <= newer_than:
                return self.version, None, None
            return self.version, [{"w": np.full(1, float(self.version), np.float32)}], None

        def insert_and_get_variables(self, index, columns, priorities, timeout, most, names,
                                     newer_than):  # fmt: skip
            self.version += 1  # the learner stepped while the rollout travelled
            return (len(priorities), most), self.get_variables(names, newer_than)

    source = RemoteVariables(Learner.remote(), polls=False)
    assert source.get_variables(["policy"])[0]["w"].item() == 0.0
    client = InsertClient(source.learner, 0, None, 1, threading.Event(), gather=1,
                          variables=source)  # fmt: skip
    client.insert({"obs": np.zeros(3, np.float32)})
    client.answered.result(timeout=30)  # the call is back (poll() itself never waits)
    client.poll()
    assert source.variables_version() == 1
    assert source.get_variables(["policy"])[0]["w"].item() == 1.0
    assert client.in_flight is None  # settled: the next rollout's call goes at once


def test_a_scripts_own_ray_runs_the_program_and_goes_on_after_it(local_ray, tmp_path):
    """A script that started Ray itself (``ray.init()``) before ``rlherd.train``: the run's
    nodes go on that Ray, asking for CPUs as on a cluster (one for the learner, ``actor_cpus``
    for each actor: here two of the two it offers), and the Ray is the script's to stop."""
    import rlherd

    run = rlherd.train("dqn", "rlherd/Corridor-v0", runtime="distributed", total_steps=300,
                       seed=0, num_actors=1, run_dir=tmp_path / "run", progress=False)  # fmt: skip
    assert run.summary["actor_steps"] >= 300 and run.summary["learner_steps"] > 0
    assert local_ray.is_initialized()
    deadline = time.monotonic() + 30  # the nodes' CPUs come back as Ray sees them gone
    while local_ray.available_resources().get("CPU") != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert local_ray.available_resources().get("CPU") == 2
