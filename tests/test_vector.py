"""BatchEnv: exactly SyncVectorEnv's stream (sync and async), faults, timeouts, clean shutdown."""

import functools
import os
import signal

import gymnasium as gym
import numpy as np
import pytest

from rlherd import envs
from rlherd.envs.vector import BatchEnv, EnvError, ExternalProcess, WorkerError
from rlherd.errors import UnsupportedEnv


def fns(env_id, n, **kw):
    return [functools.partial(envs.make, env_id, **kw)] * n


def reference(env_id, n, **kw):
    return gym.vector.SyncVectorEnv(
        fns(env_id, n, **kw), autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP
    )


@pytest.mark.parametrize(
    "env_id,kw,workers",
    [("CartPole-v1", {}, 2), ("rlherd/Corridor-v0", {"length": 3}, 3), ("CartPole-v1", {}, 1)],
)
def test_sync_matches_sync_vector_env(env_id, kw, workers):
    n = 5
    ref = reference(env_id, n, **kw)
    with BatchEnv(fns(env_id, n, **kw), num_workers=workers) as batch:
        np.testing.assert_array_equal(batch.reset(seed=7)[0], ref.reset(seed=7)[0])
        rng = np.random.default_rng(0)
        ended = 0
        for _ in range(200):
            actions = rng.integers(2, size=n)
            got, want = batch.step(actions), ref.step(actions)
            for g, w in zip(got[:4], want[:4], strict=True):
                np.testing.assert_array_equal(g, w)
            ended += int((want[2] | want[3]).sum())
        assert ended > 0, "episodes must end, so autoresets are compared too"
        assert batch.single_observation_space == ref.single_observation_space
    ref.close()


def test_async_recv_returns_the_first_batch_and_matches_per_env_streams():
    n = 6
    refs = [reference("CartPole-v1", 1) for _ in range(n)]
    with BatchEnv(fns("CartPole-v1", n), num_workers=3) as batch:
        first, _ = batch.reset(seed=11)
        for i, ref in enumerate(refs):
            np.testing.assert_array_equal(ref.reset(seed=11 + i)[0][0], first[i])
        rng = np.random.default_rng(1)
        actions = rng.integers(2, size=n)
        batch.send(actions)
        seen = 0
        for _ in range(60):
            obs, reward, terminated, truncated, info = batch.recv(batch_size=2)
            ids = info["env_id"]
            assert len(ids) == 2 and len(set(ids.tolist())) == 2
            for j, i in enumerate(ids):
                want = refs[i].step(actions[i : i + 1])
                np.testing.assert_array_equal(obs[j], want[0][0])
                assert reward[j] == want[1][0] and terminated[j] == want[2][0]
                assert truncated[j] == want[3][0]
            seen += 2
            # EnvPool style: step again exactly the environments just received
            actions[ids] = rng.integers(2, size=2)
            batch.send(actions[ids], ids)
        assert seen == 120
    for ref in refs:
        ref.close()


def test_exception_is_raised_with_the_index_and_traceback():
    env_fns = fns("CartPole-v1", 3) + fns("rlherd/Faulty-v0", 1, at=2, mode="raise")
    with BatchEnv(env_fns, num_workers=2) as batch:
        batch.reset(seed=0)
        batch.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(EnvError, match="environment 3 raised") as err:
            batch.step(np.zeros(4, dtype=np.int64))
        assert "Faulty environment fails at step 2" in str(err.value)
        assert "Traceback" in str(err.value)


def test_a_dead_worker_is_reported_and_can_be_restarted():
    env_fns = fns("CartPole-v1", 2) + fns("rlherd/Faulty-v0", 2, at=2, mode="exit")
    with BatchEnv(env_fns, num_workers=2, timeout=30) as batch:
        batch.reset(seed=0)
        batch.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(WorkerError, match="worker 1 \\(envs 2..3\\) died"):
            batch.step(np.zeros(4, dtype=np.int64))
        batch.restart_worker(1, seed=0)
        obs, *_ = batch.step(np.zeros(4, dtype=np.int64))  # its envs are at step 1 again
        assert obs.shape == (4, 4)


def test_a_worker_killed_by_a_signal_is_named_by_it():
    """A worker that the kernel's out-of-memory killer took (SIGKILL, unasked) is reported by
    that signal and the hint, not as "exit code -9"."""
    with BatchEnv(fns("CartPole-v1", 4), num_workers=2, timeout=30) as batch:
        batch.reset(seed=0)
        os.kill(batch._procs[1].pid, signal.SIGKILL)
        batch._procs[1].join()  # dead before the step is sent: the pipe breaks on send
        died = r"worker 1 \(envs 2..3\) died, killed by SIGKILL \(out of memory\? the kernel's"
        with pytest.raises(WorkerError, match=died):
            batch.step(np.zeros(4, dtype=np.int64))


def test_a_worker_that_dies_during_a_step_is_named_by_its_exit_code():
    """How it ended is reported when the worker dies while its step is in flight too (the
    answer never comes, rather than the command never going)."""
    env_fns = fns("rlherd/Faulty-v0", 2, at=1, mode="exit")
    with BatchEnv(env_fns, num_workers=1, timeout=30) as batch:
        batch.reset(seed=0)
        with pytest.raises(WorkerError, match=r"worker 0 \(envs 0..1\) died, exit code 3;"):
            batch.step(np.zeros(2, dtype=np.int64))


def test_a_hanging_step_times_out():
    env_fns = fns("rlherd/Faulty-v0", 2, at=1, mode="hang", hang_s=30)
    with BatchEnv(env_fns, num_workers=1, timeout=0.5) as batch:
        batch.reset(seed=0)
        with pytest.raises(TimeoutError, match="did not answer within 0.5s"):
            batch.step(np.zeros(2, dtype=np.int64))


def test_close_leaves_no_processes():
    batch = BatchEnv(fns("CartPole-v1", 4), num_workers=2)
    pids = [p.pid for p in batch._procs]
    batch.close()
    batch.close()  # closing twice is fine
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(RuntimeError, match="closed"):
        batch.step(np.zeros(4, dtype=np.int64))


def test_external_process_forwards_step_reset_and_attributes():
    """TF Agents' ExternalProcess: one environment in its own process behaves like the same
    environment in this one."""
    local = envs.make("CartPole-v1")
    remote = ExternalProcess(functools.partial(envs.make, "CartPole-v1"))
    try:
        assert remote.observation_space == local.observation_space
        assert remote.spec.id == "CartPole-v1"
        assert remote.get_wrapper_attr("gravity") == 9.8  # forwarded call
        with pytest.raises(EnvError, match="AttributeError"):
            remote.no_such_attribute  # noqa: B018
        assert remote.get_wrapper_attr("length") == 0.5  # the worker survived the error
        np.testing.assert_array_equal(remote.reset(seed=3)[0], local.reset(seed=3)[0])
        for t in range(30):
            a, b = remote.step(t % 2), local.step(t % 2)
            np.testing.assert_array_equal(a[0], b[0])
            assert a[1:4] == b[1:4]
            if a[2] or a[3]:
                break
        pid = remote._batch._procs[0].pid
    finally:
        remote.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_external_process_reports_the_environments_exception():
    remote = ExternalProcess(functools.partial(envs.make, "rlherd/Faulty-v0", at=1))
    try:
        remote.reset(seed=0)
        with pytest.raises(EnvError, match="Faulty environment fails at step 1"):
            remote.step(0)
    finally:
        remote.close()


def test_external_process_raises_rlherds_refusal_as_itself():
    """A StepCheck refusal came back as an EnvError holding the worker's traceback, not the
    one line it is in-process (and the process goes on, as after any failed call)."""
    remote = ExternalProcess(functools.partial(envs.make, "test_your_env:WrongShapes",
                                               fault="no reward"))  # fmt: skip
    try:
        remote.reset(seed=0)
        with pytest.raises(UnsupportedEnv, match=r"step\(\) returned the reward None"):
            remote.step(0)
        remote.reset(seed=1)
    finally:
        remote.close()


def test_make_vector_with_workers():
    vec = envs.make_vector("CartPole-v1", 4, workers=2)
    assert isinstance(vec, BatchEnv)
    assert envs.spec_of(vec, "CartPole-v1").obs_shape == (4,)
    vec.close()


def test_workers_die_with_their_parent(tmp_path):
    """A parent killed with SIGKILL leaves no worker behind (PR_SET_PDEATHSIG)."""
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import functools, time\n"
        "from rlherd import envs\n"
        "from rlherd.envs.vector import BatchEnv\n"
        "if __name__ == '__main__':\n"
        "    b = BatchEnv([functools.partial(envs.make, 'CartPole-v1')] * 2, num_workers=2)\n"
        "    print(' '.join(str(p.pid) for p in b._procs), flush=True)\n"
        "    time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in parent.stdout.readline().split()]
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in pids if _alive(p)]
    assert not alive


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_after_a_worker_fails_the_batch_stays_in_step_with_its_workers():
    """Worker 1's environment raises: worker 0's answer to that step must still be read (else
    every later step returns worker 0's previous step), and stepping again without
    restart_worker is a WorkerError, not a BrokenPipeError."""
    env_fns = fns("CartPole-v1", 2) + fns("rlherd/Faulty-v0", 2, at=2, mode="raise")
    reference = [envs.make("CartPole-v1") for _ in range(2)]
    with BatchEnv(env_fns, num_workers=2, timeout=30) as batch:
        batch.reset(seed=0)
        for i, env in enumerate(reference):
            env.reset(seed=i)
        actions = np.zeros(4, dtype=np.int64)
        batch.step(actions)
        with pytest.raises(EnvError, match="environment 2 raised"):
            batch.step(actions)
        assert not batch._conns[0].poll(1.0), "worker 0's answer was left unread"
        with pytest.raises(WorkerError, match="restart_worker\\(1\\)"):
            batch.step(actions)
        batch.restart_worker(1, seed=0)
        obs, *_ = batch.step(actions)
        # Worker 0 stepped three times (the failed step included), as the reference has.
        expected = [[env.step(0)[0] for _ in range(3)][-1] for env in reference]
        np.testing.assert_allclose(obs[:2], expected, rtol=1e-6)
