"""The distributed runtime's Ray, seen from the network and from the terminal: an embedded Ray
listens on loopback only, and a restarted actor node says so when it happens.

Tests that start Ray are marked ``ray``."""

import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

CORRIDOR = "rlherd/Corridor-v0"
LINUX_PROC = Path("/proc/net/tcp").exists()


# --------------------------------------------------------------- what a process tree listens on
def _listening_sockets() -> dict[int, tuple[str, int]]:
    """Every listening TCP socket on this machine: inode -> (address, port)."""
    found = {}
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path("/proc/net") / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)  # the kernel writes each 32-bit word in host order
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found[int(fields[9])] = (socket.inet_ntop(family, words), int(port, 16))
    return found


def _process_group(leader: int) -> set[int]:
    """The leader and every process of its session or below it in the process tree."""
    parents, session = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        parents[int(entry.name)], session[int(entry.name)] = int(fields[1]), int(fields[3])
    group = {pid for pid, sid in session.items() if sid == leader} | {leader}
    grew = True
    while grew:
        below = {pid for pid, parent in parents.items() if parent in group} - group
        group |= below
        grew = bool(below)
    return group & set(parents)


def _listeners(leader: int) -> set[tuple[str, int, str]]:
    """(address, port, process) for every listening TCP socket of the leader's processes."""
    sockets, found = _listening_sockets(), set()
    for pid in _process_group(leader):
        try:
            name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            inode = int(link[8:-1]) if link.startswith("socket:[") else None
            if inode in sockets:
                found.add((*sockets[inode], f"{pid} {name}"))
    return found


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a v6 socket bound to v4's
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def test_loopback_is_told_from_every_other_address():
    """What the Ray test below reads as loopback, and what it does not."""
    assert all(map(_is_loopback, ["127.0.0.1", "::1", "::ffff:127.0.0.1"]))
    assert not any(map(_is_loopback, ["0.0.0.0", "::", "192.0.2.2", "::ffff:10.0.0.1"]))


@pytest.mark.skipif(not LINUX_PROC, reason="reads Linux's /proc")
def test_listening_sockets_of_a_process_tree_are_found():
    """The helper the Ray test relies on sees a child's socket, on the address it is bound to."""
    code = "import socket,time;s=socket.socket();s.bind(('0.0.0.0',0));s.listen();time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not (found := _listeners(child.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [(address, name.split()[0]) for address, _, name in found] == [
            ("0.0.0.0", str(child.pid))
        ]
    finally:
        child.kill()
        child.wait()


# ------------------------------------------------------------------ runs on an embedded Ray
def _wait_for(path: Path, ready, timeout: float = 120.0) -> None:
    """Wait until ``ready(json in path)`` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready(json.loads(path.read_text())):
                return
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"{path} did not show the run going")


@pytest.mark.ray
@pytest.mark.skipif(not LINUX_PROC, reason="reads Linux's /proc")
def test_an_embedded_ray_listens_on_loopback_only_and_is_gone_after_the_run(tmp_path):
    """While a distributed run with no --ray-address trains, no process it started (Ray's GCS,
    raylet, workers, agents, monitor, the driver's own Ray server) listens on an address other
    than loopback; once it ends, none of them is left."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlherd.cli", "train", "dqn", "--env", CORRIDOR, "--runtime",
           "distributed", "--num-actors", "2", "--total-steps", "10000000", "--run-dir",
           str(run_dir), "--no-progress"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    process = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, env=env)
    try:
        _wait_for(run_dir / "nodes.json", lambda nodes: "actor-1" in nodes)
        _wait_for(run_dir / "summary.json", lambda summary: summary["learner_steps"] >= 20)
        seen = set()
        for _ in range(5):  # a few looks, for services that open their ports late
            seen |= _listeners(process.pid)
            time.sleep(0.5)
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=60) == 130  # Ctrl-C's exit code
        deadline = time.monotonic() + 30
        while (left := _process_group(process.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert len(seen) >= 4, f"too few of Ray's sockets found to judge: {seen}"
    exposed = sorted(s for s in seen if not _is_loopback(s[0]))
    assert not exposed, "listening beyond loopback:\n" + "\n".join(map(str, exposed))
    assert not left, f"processes of the run left running: {left}"


# -------------------------------------------------------------------- a restarted actor node
@pytest.mark.ray
def test_a_restarted_actor_node_says_so_on_stderr_when_it_happens(tmp_path):
    """Killing an actor node's process prints one line, while the run goes on, naming the node,
    why it died and how many restarts the run allows; summary.json counts the same restarts."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlherd.cli", "train", "dqn", "--env", CORRIDOR, "--runtime",
           "distributed", "--num-actors", "2", "--total-steps", "10000000", "--run-dir",
           str(run_dir), "--no-progress"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    process = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(process.stderr), daemon=True)
    reader.start()
    try:
        _wait_for(run_dir / "nodes.json", lambda nodes: "actor-1" in nodes)
        _wait_for(run_dir / "summary.json", lambda summary: summary["learner_steps"] >= 20)
        nodes = json.loads((run_dir / "nodes.json").read_text())
        os.kill(nodes["actor-0"]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not any("died" in line for line in said) and time.monotonic() < deadline:
            time.sleep(0.1)
        running = process.poll() is None
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=60) == 130  # Ctrl-C's exit code
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    reader.join(timeout=10)
    lines = [line.rstrip("\n") for line in said if "died" in line]
    assert lines and running, f"no line while the run went on; its stderr:\n{''.join(said)}"
    assert re.fullmatch(r"rlherd: actor node 0 died \([^()]+\); restarted \(1 of at most 40 "
                        r"restarts\)", lines[0]), lines  # fmt: skip
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["actor_restarts"] == len(lines), (summary, lines)


def test_the_reason_an_actor_died_is_one_line_of_rays_report():
    """Ray's report of a dead actor (built by Ray's own class) is many lines: the node's line
    keeps its reason and the worker's exit detail, on one line."""
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    from ray.exceptions import ActorDiedError

    from rlherd.runtime.distributed import death_reason

    context = ActorDiedErrorContext(
        class_name="ActorNode", actor_id=bytes(16), pid=4242, node_ip_address="127.0.0.1",
        error_message="The actor is dead because its worker process has died. Worker exit type: "
        "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code "
        "2. End of file. Some common causes include: (1) the OOM killer.",
    )  # fmt: skip
    assert len(str(ActorDiedError(context)).splitlines()) > 3
    assert death_reason(ActorDiedError(context)) == (
        "The actor is dead because its worker process has died; Worker unexpectedly exits with "
        "a connection error code 2"
    )
    assert death_reason(ActorDiedError()).startswith("The actor died unexpectedly before")
