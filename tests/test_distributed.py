"""The distributed runtime: the program's pieces, and whole programs on a local Ray under faults.

Learning on it is in tests/test_matrix.py (every agent learns Corridor there, as on every
runtime). Tests that start Ray are marked ``ray``."""

import functools
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import rlherd
from rlherd.envs.vector import alive
from rlherd.errors import ConfigError, NodeDied
from rlherd.replay import Table
from rlherd.replay.rollouts import join
from rlherd.run.rundir import RunDir

CORRIDOR = "rlherd/Corridor-v0"


def test_queued_rollouts_join_as_the_in_process_join_does():
    """The learner's batch from N queued rollouts must be the same as joining them: every field
    (recurrent state included) has its environments in dimension 1."""
    from rlherd.runtime.program import _join

    gen = torch.Generator().manual_seed(0)
    shapes = {"obs": (5, 3, 4), "reward": (5, 3), "core_state.0": (2, 3, 7)}
    rollouts = [{k: torch.randn(shape, generator=gen) for k, shape in shapes.items()}
                for _ in range(4)]  # fmt: skip
    stacked = {k: torch.stack([r[k] for r in rollouts]) for k in rollouts[0]}
    expected = join(rollouts)
    for k, v in stacked.items():
        torch.testing.assert_close(_join(v), expected[k], rtol=0, atol=0)


def test_a_learner_nodes_state_pickles_a_flattened_networks_memory_once():
    """The learner node's checkpoint state goes through Ray's pickling; a flattened network's
    parameters are views of one tensor, and each view must arrive as its own values, not with
    the whole flat tensor (once per view)."""
    import pickle

    from rlherd.agents.learning import flatten_parameters
    from rlherd.runtime.program import _to_cpu

    net = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(4)))
    flatten_parameters(net)
    state = _to_cpu(dict(learner=dict(net=net.state_dict(), num_steps=3)))
    values = sum(v.numel() * 4 for v in net.state_dict().values())
    assert len(pickle.dumps(state)) < 1.2 * values
    for k, v in net.state_dict().items():
        assert torch.equal(state["learner"]["net"][k], v)
    assert state["learner"]["num_steps"] == 3


def test_a_reader_of_the_learners_parameters_is_let_in_after_the_learners_step():
    """The learner takes its lock step after step; a reader waiting for it must get it after
    the step under way, not whenever the learner happens to let go (a Python lock is not
    fair). Counted in learner steps, not seconds: how many steps each of 100 reads waited."""
    from rlherd.runtime.program import TakeTurns

    turns, steps, stop = TakeTurns(wait_s=1.0), [0], threading.Event()

    def learner() -> None:
        while not stop.is_set():
            with turns.lock:  # a step that holds the GIL too, as Python code does
                sum(range(20_000))
                steps[0] += 1
            turns.yield_to_readers()

    thread = threading.Thread(target=learner, daemon=True)
    thread.start()
    waited = []
    try:
        for _ in range(100):
            asked = steps[0]
            with turns.reading():
                waited.append(steps[0] - asked)
            time.sleep(0.002)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert max(waited) <= 2, waited  # the step under way, and one begun as it asked


def test_a_variable_client_catches_up_with_an_asynchronous_source():
    """A source that answers with older variables than the version it reports (the learner
    node's prefetching client) must be asked again until the newest is loaded, and then not
    reloaded while nothing changes."""
    from rlherd.core import VariableClient

    class Prefetching:
        def __init__(self):
            self.version, self.fetched_version, self.fetches = 2, 0, 0

        def variables_version(self):
            return self.version

        def get_variables(self, names):
            self.fetches += 1
            self.fetched_version = min(self.fetched_version + 1, self.version)  # one behind
            return [{"weight": torch.full((1, 1), float(self.fetched_version))}]

    source, net = Prefetching(), torch.nn.Linear(1, 1, bias=False)
    client = VariableClient(source, net)
    client.update()
    assert net.weight.item() == 1.0  # what had arrived
    client.update()
    assert net.weight.item() == 2.0  # asked again: the newest
    fetches = source.fetches
    client.update()
    assert source.fetches == fetches  # nothing new: nothing fetched


def test_a_queue_waits_for_a_whole_batch():
    signature = {"x": ((), np.float32)}
    table = Table.queue("q", signature, 4)
    table.insert({"x": 1.0})
    assert not table.wait_until_can_sample(2, timeout=0.05)
    assert table.size == 1  # nothing was taken by the wait that timed out
    table.insert({"x": 2.0})
    assert table.wait_until_can_sample(2, timeout=0.05)


def test_the_counter_nodes_module_imports_no_torch():
    """The counter's process starts beside the other nodes' on a run's first seconds; importing
    torch there (2-3 s of a core) would delay them all on a small machine."""
    code = "import sys, rlherd.runtime.node; print('torch' in sys.modules)"
    root = str(Path(__file__).parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=root))  # fmt: skip
    assert out.stdout.strip() == "False", out.stderr


# (agent, settings, what the one-line refusal says)
UNRUNNABLE = [
    ("impala", dict(envs_per_actor=3), "multiple of envs_per_actor"),
    ("impala", dict(insert_chunk=8), "replay agents"),
    ("dqn", dict(actor_cpus=0), "actor_cpus must be > 0"),
    ("dqn", dict(actor_resources={"actors": 1}), "join one with --ray-address"),
    ("dqn", dict(learner_resources={"gpu_box": "1"}, ray_address="auto"),
     "learner_resources maps Ray resource names"),
    ("dqn", dict(actor_resources=["actors"], ray_address="auto"),
     r"actor_resources=\['actors'\]: expected a dict, e.g."),
    ("dqn", dict(actor_resources={"CPU": 2}, ray_address="auto"),
     "asked for by --actor-cpus and --device"),
    ("impala", dict(rollouts_per_call=-1), "rollouts_per_call must be >= 0"),
    ("dqn", dict(rollouts_per_call=2), "rollout agents"),
    ("impala", dict(rollouts_per_call=5, num_buffers=4), "more than the queue holds"),
]  # fmt: skip


def test_settings_the_program_could_not_run_are_refused_before_ray_starts(tmp_path):
    for i, (agent, settings, refusal) in enumerate(UNRUNNABLE):
        with pytest.raises(ConfigError, match=refusal):
            rlherd.train(agent, CORRIDOR, runtime="distributed", run_dir=tmp_path / str(i),
                         progress=False, **settings)  # fmt: skip
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------- programs on Ray
@pytest.fixture
def local_ray():
    """A local Ray for a test of the program's pieces (whole programs start their own)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


@pytest.mark.ray
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
        setup = NodeSetup(builder, spec, "CartPole-v1", {}, Distributed())
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


@pytest.mark.ray
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


@pytest.mark.ray
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
    setup = NodeSetup(builder, spec, "CartPole-v1", {}, settings)
    k = settings.envs_per_actor
    queue = functools.partial(_queue_table, rollout_signature(builder, spec, k), capacity)
    learner = ray.remote(learner_cls).options(max_concurrency=4).remote(
        setup, None, 10**6, builder.batch_size // k, queue)  # fmt: skip
    counter = ray.remote(CounterNode).remote()
    actor = ray.remote(ActorNode).options(max_concurrency=2).remote(
        0, 0, setup, None, learner, counter)  # fmt: skip
    return learner, actor, counter


@pytest.mark.ray
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


@pytest.mark.ray
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


@pytest.mark.ray
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


def _nodes(run_dir: Path, timeout: float = 120.0) -> dict:
    """nodes.json once every node (actors included) has started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            nodes = json.loads((run_dir / "nodes.json").read_text())
            if "actor-0" in nodes:
                return nodes
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.1)
    raise AssertionError("the program's nodes did not start")


def _trained_a_little(run_dir: Path, timeout: float = 60.0) -> None:
    """Wait until the run's summary counts 20 learner steps."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if json.loads((run_dir / "summary.json").read_text())["learner_steps"] >= 20:
                return
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.1)


def _kill_when_running(run_dir: Path, node: str, killed: dict) -> threading.Thread:
    """SIGKILL ``node``'s process once the run has trained a little."""

    def kill() -> None:
        nodes = _nodes(run_dir)
        _trained_a_little(run_dir)
        killed.update(nodes)
        os.kill(nodes[node]["pid"], signal.SIGKILL)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


@pytest.mark.ray
def test_a_node_that_cannot_be_built_says_why_and_leaves_no_run(tmp_path):
    """A config error inside a node's constructor (DQN's learner asked for an image torso on
    CartPole) is the ConfigError itself, not "the learner node died"."""
    with pytest.raises(ConfigError, match="needs image observations"):
        rlherd.train("dqn", "CartPole-v1", runtime="distributed", torso="deep",
                     run_dir=tmp_path / "run", progress=False)  # fmt: skip
    assert not (tmp_path / "run").exists()


@pytest.mark.ray
def test_a_killed_actor_node_is_restarted_and_counted(tmp_path):
    run_dir, killed = tmp_path / "run", {}
    thread = _kill_when_running(run_dir, "actor-0", killed)
    run = rlherd.train("dqn", CORRIDOR, runtime="distributed", total_steps=6_000, seed=0,
                       run_dir=run_dir, progress=False)  # fmt: skip
    thread.join(timeout=5)
    assert killed, "the actor was never killed"
    assert run.summary["actor_restarts"] >= 1, run.summary
    assert run.summary["actor_steps"] >= 6_000
    after = json.loads((run_dir / "nodes.json").read_text())
    assert after["actor-0"]["pid"] != killed["actor-0"]["pid"]
    assert not [n for n, w in after.items() if alive(w["pid"])], "nodes left running"


@pytest.mark.ray
def test_a_killed_learner_ends_the_run_with_nothing_left_running(tmp_path):
    run_dir, killed = tmp_path / "run", {}
    thread = _kill_when_running(run_dir, "learner", killed)
    with pytest.raises(NodeDied, match="the learner node died.*--resume"):
        rlherd.train("dqn", CORRIDOR, runtime="distributed", total_steps=10**7, seed=0,
                     run_dir=run_dir, progress=False)  # fmt: skip
    thread.join(timeout=5)
    left = [name for name, where in killed.items() if alive(where["pid"])]
    assert not left, f"nodes still running after the run ended: {left}"
    import ray

    assert not ray.is_initialized()


@pytest.mark.ray
def test_resume_restores_counters_and_replay(tmp_path):
    run_dir = tmp_path / "run"
    first = rlherd.train("dqn", CORRIDOR, runtime="distributed", total_steps=3_000, seed=0,
                         run_dir=run_dir, progress=False)  # fmt: skip
    rows = (run_dir / "metrics" / "replay.csv").read_text().splitlines()
    size_before = int(rows[-1].split(",")[2])
    assert size_before > 0
    second = rlherd.train(resume=run_dir, total_steps=5_000, progress=False)
    rows_after = (run_dir / "metrics" / "replay.csv").read_text().splitlines()
    header = rows_after[0].split(",")
    first_of_resumed = dict(zip(header, rows_after[len(rows)].split(","), strict=False))
    # The resumed replay node starts with the checkpointed table, not an empty one.
    assert int(first_of_resumed["size"]) >= size_before
    assert int(first_of_resumed["actor_steps"]) >= first.summary["actor_steps"]
    assert second.summary["learner_steps"] > first.summary["learner_steps"]
    assert second.summary["actor_steps"] >= 5_000
    assert second.summary["episodes"] > first.summary["episodes"]


@pytest.mark.ray
def test_network_sizes_edited_before_a_resume_are_one_line(tmp_path, capsys):
    """The learner node's size-mismatch came back as Ray's traceback of the node, not the one
    line every other runtime's resume gives."""
    from rlherd.cli import main

    run_dir = tmp_path / "run"
    rlherd.train("dqn", CORRIDOR, runtime="distributed", total_steps=500, seed=0,
                 run_dir=run_dir, progress=False)  # fmt: skip
    record = json.loads((run_dir / "config.json").read_text())
    record["config"]["hidden_sizes"] = [7]
    (run_dir / "config.json").write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--total-steps", "100000",
                 "--no-progress"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not fit the run's config" in err, err


@pytest.mark.ray
@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_stopping_a_run_stops_every_node_and_writes_a_final_checkpoint(tmp_path, stop):
    """Ctrl-C (SIGINT to the terminal's process group: the driver and every process it started
    on this machine) or SIGTERM to the driver alone (what a job scheduler sends) ends the run
    with a checkpoint, and nothing left running."""
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlherd.cli", "train", "dqn", "--env", CORRIDOR, "--runtime",
           "distributed", "--total-steps", "10000000", "--run-dir", str(run_dir),
           "--no-progress"]  # fmt: skip
    process = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        nodes = _nodes(run_dir)
        _trained_a_little(run_dir)
        if stop == "ctrl-c":
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == (130 if stop == "ctrl-c" else 143)  # 128 + signal
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    checkpoint = RunDir(run_dir).load_checkpoint()
    assert checkpoint["recorder"]["counters"]["learner_steps"] > 20
    left = [name for name, where in nodes.items() if alive(where["pid"])]
    assert not left, f"nodes still running after Ctrl-C: {left}"
