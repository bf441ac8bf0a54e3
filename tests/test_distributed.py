"""The distributed runtime: the program's pieces, and whole programs on a local Ray under faults.

Learning on it is in tests/test_matrix.py (every agent learns Corridor there, as on every
runtime); its nodes on one Ray, a few at a time, in tests/test_distributed_nodes.py. Tests that
start Ray are marked ``ray``."""

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


# ------------------------------------------------------------------ whole programs on Ray
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
