"""The distributed runtime on a Ray cluster of several Ray nodes: placement by resources, a worker
node lost under the actors, a learner's node lost and the run resumed.

The cluster is Ray's own test cluster (``ray.cluster_utils.Cluster``: a head and worker nodes,
each with its own raylet and resources, as ``ray start`` makes them on separate machines), on
this machine and on loopback only. The run joins it by address, as on a real cluster."""

import json
import threading
import time
from pathlib import Path

import pytest

import rlherd
from rlherd.envs.vector import alive
from rlherd.errors import NodeDied

CORRIDOR = "rlherd/Corridor-v0"
CORE = ("learner", "replay", "counter")

pytestmark = pytest.mark.ray


@pytest.fixture
def cluster():
    """A head node with no CPUs (so nothing is placed on it unasked), worker nodes added by the
    test. Its services listen on loopback: Ray replaces a loopback address by the machine's in
    cluster mode, which is switched off while the nodes start."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    mode = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    # A lost node is noticed within a second or two (Ray's default takes half a minute).
    fast = dict(health_check_initial_delay_ms=0, health_check_period_ms=500,
                health_check_failure_threshold=2)  # fmt: skip
    made = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=0, node_ip_address="127.0.0.1", include_dashboard=False, _system_config=fast))
    made.add = lambda **resources: made.add_node(  # a worker node: 1 CPU and these resources
        num_cpus=1, resources=resources, node_ip_address="127.0.0.1")  # fmt: skip
    try:
        yield made
    finally:
        made.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = mode


def _train(cluster, run_dir: Path, **kwargs):
    return rlherd.train("dqn", CORRIDOR, runtime="distributed", seed=0, run_dir=run_dir,
                        ray_address=cluster.address, num_actors=2, actor_cpus=0.5,
                        actor_resources={"actors": 1}, learner_resources={"learner": 1},
                        progress=False, **kwargs)  # fmt: skip


def _nodes(run_dir: Path, timeout: float = 180.0) -> dict:
    """nodes.json once every node has started and the learner has taken 20 steps."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            nodes = json.loads((run_dir / "nodes.json").read_text())
            steps = json.loads((run_dir / "summary.json").read_text())["learner_steps"]
            if "actor-1" in nodes and steps >= 20:
                return nodes
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError("the program did not start training")


def _remove_when_training(cluster, run_dir: Path, node_of: str, removed: dict) -> threading.Thread:
    """Kill (no graceful exit) the Ray node that runs ``node_of`` once the run trains."""

    def remove() -> None:
        nodes = _nodes(run_dir)
        target = next(n for n in cluster.worker_nodes if n.node_id == nodes[node_of]["node_id"])
        removed.update(nodes=nodes, node_id=target.node_id)
        cluster.remove_node(target, allow_graceful=False)

    thread = threading.Thread(target=remove, daemon=True)
    thread.start()
    return thread


def _left_running(nodes: dict) -> list[str]:
    return [name for name, where in nodes.items() if alive(where["pid"])]


def test_nodes_are_placed_by_the_resources_they_ask_for(cluster, tmp_path):
    learner_node = cluster.add(learner=1)
    actor_nodes = {cluster.add(actors=2).node_id for _ in range(2)}
    run = _train(cluster, tmp_path / "run", total_steps=3_000)
    nodes = json.loads((tmp_path / "run" / "nodes.json").read_text())
    assert {nodes[n]["node_id"] for n in CORE} == {learner_node.node_id}, nodes
    assert {nodes[f"actor-{i}"]["node_id"] for i in range(2)} <= actor_nodes, nodes
    assert run.summary["actor_steps"] >= 3_000
    assert not _left_running(nodes)


def test_a_lost_worker_node_s_actors_are_restarted_on_a_live_one(cluster, tmp_path):
    cluster.add(learner=1)
    for _ in range(2):
        cluster.add(actors=2)
    run_dir, removed = tmp_path / "run", {}
    thread = _remove_when_training(cluster, run_dir, "actor-0", removed)
    run = _train(cluster, run_dir, total_steps=8_000)
    thread.join(timeout=5)
    assert removed, "no node was removed"
    assert run.summary["actor_restarts"] >= 1, run.summary
    assert run.summary["actor_steps"] >= 8_000
    after = json.loads((run_dir / "nodes.json").read_text())
    assert after["actor-0"]["node_id"] != removed["node_id"]
    assert after["actor-0"]["pid"] != removed["nodes"]["actor-0"]["pid"]
    assert not _left_running(after) and not _left_running(removed["nodes"])


def test_a_lost_learner_node_stops_the_run_and_resume_continues(cluster, tmp_path):
    cluster.add(learner=1)
    cluster.add(actors=2)
    run_dir, removed = tmp_path / "run", {}
    thread = _remove_when_training(cluster, run_dir, "learner", removed)
    with pytest.raises(NodeDied, match="node died.*--resume"):
        _train(cluster, run_dir, total_steps=10**7, checkpoint_interval_s=1.0)
    thread.join(timeout=5)
    assert not _left_running(removed["nodes"])
    stopped_at = json.loads((run_dir / "summary.json").read_text())["learner_steps"]

    # The cluster it resumes on may name its machines otherwise: placement is the machine's.
    replacement = cluster.add(gpu_box=1)
    run = rlherd.train(resume=run_dir, total_steps=6_000, ray_address=cluster.address,
                       learner_resources={"gpu_box": 1}, progress=False)  # fmt: skip
    nodes = json.loads((run_dir / "nodes.json").read_text())
    assert nodes["learner"]["node_id"] == replacement.node_id
    recorded = json.loads((run_dir / "config.json").read_text())["settings"]
    assert recorded["learner_resources"] == {"gpu_box": 1}  # what the run last ran with
    assert run.summary["learner_steps"] > stopped_at
    assert run.summary["actor_steps"] >= 6_000
    assert not _left_running(nodes)
