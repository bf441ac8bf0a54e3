"""``BatchEnv``: environments in worker processes, results in shared memory (TF Agents' batched
``ExternalProcess`` environments; EnvPool's asynchronous ``send`` / ``recv``).

Each of ``num_workers`` processes steps a contiguous block of environments. Actions, observations,
rewards and flags live in shared memory that the workers read and write in place; the pipes carry
only short commands and the indices of the environments stepped, so IPC cost does not grow with
the observation size.

- ``step(actions)``: every environment steps; a drop-in Gymnasium ``VectorEnv`` with next-step
  autoreset, matching ``SyncVectorEnv`` exactly for the same seeds and actions.
- ``send(actions, env_ids)`` / ``recv()``: step some environments and get back the first
  ``batch_size`` that finish (their ids in ``info["env_id"]``), so slow environments do not stall
  the batch.

Faults: an exception inside an environment is raised here with the worker's traceback and the
environment's index (:class:`EnvError`), except rlherd's own refusals (a :class:`ConfigError`,
such as a :class:`~rlherd.envs.wrappers.StepCheck` finding), raised as they are; a dead worker
raises :class:`WorkerError` (and ``restart_worker`` replaces it); a step slower than ``timeout``
raises ``TimeoutError`` instead of hanging. ``close()``, the context manager and interpreter exit
stop every worker, and workers die with their parent (:func:`die_with_parent`).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
import threading
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing import shared_memory
from multiprocessing.connection import Connection, wait
from typing import Any

import gymnasium as gym
import numpy as np

from rlherd import types
from rlherd.errors import ConfigError, exit_status


class EnvError(RuntimeError):
    """An environment raised inside its worker."""


class WorkerError(RuntimeError):
    """A worker process died, or failed and must be restarted (``restart_worker``)."""


STARTUP_TIMEOUT_S = 120.0


def _shared_layout(obs_space: gym.Space, act_space: gym.Space, n: int) -> dict[str, tuple]:
    """One shared block per array: the observation's (one per key of a dict observation, as
    ``obs.<key>``), the actions, rewards and flags."""
    if isinstance(obs_space, gym.spaces.Dict):
        obs = {f"obs.{k}": ((n, *s.shape), s.dtype) for k, s in obs_space.spaces.items()}
    else:
        obs = {"obs": ((n, *obs_space.shape), obs_space.dtype)}
    return dict(
        **obs,
        action=((n, *act_space.shape), act_space.dtype),
        reward=((n,), np.float64),
        terminated=((n,), np.bool_),
        truncated=((n,), np.bool_),
    )


def die_with_parent() -> None:
    """Kill this multiprocessing child (an environment worker, a ``mono`` actor) once the
    process that started it is gone, so none is ever orphaned. A daemon thread waits on the
    parent's sentinel, a pipe inherited at start, so there is no window in which the parent's
    death goes unseen. (Linux's ``PR_SET_PDEATHSIG`` fires when the parent *thread* that
    started the child ends, which killed children restarted from a short-lived thread.)"""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="die-with-parent").start()


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _views(blocks: dict[str, shared_memory.SharedMemory], layout: dict[str, tuple]):
    views = {
        k: np.ndarray(shape, dtype, buffer=blocks[k].buf) for k, (shape, dtype) in layout.items()
    }
    if "obs" not in views:  # a dict observation: its arrays, by key, as one view
        views["obs"] = types.obs_of(views)
    return views


def _write_obs(buf: dict[str, Any], index: int, obs: Any) -> None:
    if isinstance(obs, dict):
        for k, v in obs.items():
            buf["obs"][k][index] = v
    else:
        buf["obs"][index] = obs


def _worker(
    conn: Connection,
    env_fns: list[Callable[[], gym.Env]],
    first: int,
    names: dict[str, str],
    layout: dict[str, tuple],
) -> None:
    """Step environments ``first .. first + len(env_fns) - 1`` on command."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    blocks = {k: shared_memory.SharedMemory(name=v) for k, v in names.items()}
    buf = _views(blocks, layout)
    envs: list[gym.Env] = []
    resetting = np.zeros(len(env_fns), dtype=bool)
    current = first
    try:
        for fn in env_fns:
            envs.append(fn())
        conn.send(("ready", None))
        while True:
            cmd, arg = conn.recv()
            if cmd == "reset":
                for i, env in enumerate(envs):
                    current = first + i
                    obs, _ = env.reset(seed=None if arg is None else arg[i])
                    _write_obs(buf, current, obs)
                resetting[:] = False
                conn.send(("ok", None))
            elif cmd == "step":
                for i in range(len(envs)) if arg is None else arg:
                    current = first + i
                    if resetting[i]:  # next-step autoreset: this step only resets
                        obs, _ = envs[i].reset()
                        reward, terminated, truncated = 0.0, False, False
                    else:
                        obs, reward, terminated, truncated, _ = envs[i].step(buf["action"][current])
                    _write_obs(buf, current, obs)
                    buf["reward"][current] = reward
                    buf["terminated"][current] = terminated
                    buf["truncated"][current] = truncated
                    resetting[i] = terminated or truncated
                conn.send(("ok", arg))
            elif cmd == "call":  # (env index, attribute, args or None for a plain read, kwargs)
                i, name, args, kwargs = arg
                try:  # a failed call is reported; the environment goes on
                    value = getattr(envs[i], name)
                    conn.send(("ok", value(*args, **kwargs) if args is not None else value))
                except ConfigError as e:  # rlherd's refusal (StepCheck's), as in-process
                    conn.send(("refused", e))
                except Exception:
                    conn.send(("error", (first + i, traceback.format_exc())))
            elif cmd == "close":
                break
    except (KeyboardInterrupt, EOFError, BrokenPipeError):
        pass
    except ConfigError as e:  # a refusal (StepCheck's) is one line here as in-process
        with contextlib.suppress(OSError):
            conn.send(("refused", e))
    except Exception:
        with contextlib.suppress(OSError):
            conn.send(("error", (current, traceback.format_exc())))
    finally:
        for env in envs:
            with contextlib.suppress(Exception):
                env.close()
        for block in blocks.values():
            block.close()


class BatchEnv(gym.vector.VectorEnv):
    """``len(env_fns)`` environments in ``num_workers`` processes (see the module docstring).

    Args:
        env_fns: picklable functions that build one environment each.
        num_workers: processes; environments are split into contiguous blocks (default: one
            per environment up to the number of CPUs).
        timeout: seconds any command may take before ``TimeoutError``.
        batch_size: how many environments ``recv()`` returns (default: all).
    """

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        num_workers: int | None = None,
        timeout: float = 60.0,
        batch_size: int | None = None,
    ):
        self.env_fns = list(env_fns)
        self.num_envs = len(self.env_fns)
        if self.num_envs < 1:
            raise ValueError("BatchEnv needs at least one environment")
        num_workers = num_workers or min(self.num_envs, mp.cpu_count())
        if not 1 <= num_workers <= self.num_envs:
            raise ValueError(f"num_workers must be in [1, {self.num_envs}], got {num_workers}")
        self.timeout = timeout
        self.batch_size = batch_size or self.num_envs
        probe = self.env_fns[0]()
        self.single_observation_space = probe.observation_space
        self.single_action_space = probe.action_space
        self.spec = probe.spec
        probe.close()
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, self.num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)

        self._layout = _shared_layout(
            self.single_observation_space, self.single_action_space, self.num_envs
        )
        self._blocks = {
            k: shared_memory.SharedMemory(
                create=True, size=max(1, int(np.prod(s)) * np.dtype(d).itemsize)
            )
            for k, (s, d) in self._layout.items()
        }
        self._buf = _views(self._blocks, self._layout)
        bounds = np.linspace(0, self.num_envs, num_workers + 1).round().astype(int)
        self._ranges = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        self._ctx = mp.get_context("spawn")
        self._procs: list[Any] = [None] * num_workers
        self._conns: list[Connection | None] = [None] * num_workers
        self._pending = np.zeros(num_workers, dtype=bool)  # a step is in flight
        self._queued: list[list[int]] = [[] for _ in range(num_workers)]  # wait for that step
        self._ready: deque[int] = deque()  # stepped environments not yet returned by recv
        # Workers that died, raised, or did not answer in time: their environments are in an
        # unknown state, so each command refuses them until restart_worker replaces them.
        self._broken: set[int] = set()
        self.closed = False
        try:
            for w in range(num_workers):
                self._start(w)
            for w in range(num_workers):
                self._expect(w, "ready")
        except BaseException:
            self.close()
            raise
        _live.add(self)

    # ---------------------------------------------------------------------------- workers
    def _start(self, w: int) -> None:
        a, b = self._ranges[w]
        parent, child = self._ctx.Pipe()
        names = {k: block.name for k, block in self._blocks.items()}
        p = self._ctx.Process(
            target=_worker, args=(child, self.env_fns[a:b], a, names, self._layout), daemon=True
        )
        p.start()
        child.close()
        self._procs[w], self._conns[w] = p, parent

    def _refuse_broken(self, workers) -> None:
        for w in sorted(self._broken.intersection(workers)):
            a, b = self._ranges[w]
            raise WorkerError(
                f"environment worker {w} (envs {a}..{b - 1}) failed earlier; call "
                f"restart_worker({w}) to replace it"
            )

    def _died(self, w: int, starting: bool = False) -> WorkerError:
        """The error for worker ``w``, found dead on its pipe, named by how it ended (a signal
        such as the out-of-memory killer's SIGKILL says more than a broken pipe). One that
        raised while ``starting`` would raise again if restarted; the usual cause is a script
        with no main guard, which the worker imports first."""
        self._procs[w].join(timeout=1)
        a, b = self._ranges[w]
        code = self._procs[w].exitcode
        if starting and code is not None and code > 0:
            return WorkerError(
                f"environment worker {w} (envs {a}..{b - 1}) failed while starting "
                f"({exit_status(code)}); see its traceback above. Scripts that use env_workers "
                "must guard their calls with `if __name__ == '__main__':` (each worker imports "
                "the script)"
            )  # fmt: skip
        return WorkerError(
            f"environment worker {w} (envs {a}..{b - 1}) died, "
            f"{exit_status(code)}; call restart_worker({w}) to replace it"
        )

    def _send(self, w: int, message: tuple) -> None:
        self._refuse_broken([w])
        try:
            self._conns[w].send(message)
        except OSError:  # BrokenPipeError: it died since it last answered
            self._broken.add(w)
            raise self._died(w) from None

    def _command(self, message: Callable[[int], tuple]) -> None:
        """Send every worker its ``message(w)`` and read every answer, even after one of them
        failed: an answer left unread would be taken for the next command's, and the batch would
        fall a step behind its workers. Then raise the first failure. While a worker is broken,
        no worker is sent anything: the batch steps together or not at all."""
        self._refuse_broken(range(len(self._ranges)))
        sent, error = [], None
        for w in range(len(self._ranges)):
            try:
                self._send(w, message(w))
                sent.append(w)
            except WorkerError as e:
                error = error or e
        for i, w in enumerate(sent):
            try:
                self._expect(w, "ok")
            except (EnvError, ConfigError, WorkerError, TimeoutError) as e:
                error = error or e
            except BaseException:  # interrupted: the answers not read yet are unknown
                self._broken.update(sent[i:])
                raise
        if error is not None:
            raise error

    def _expect(self, w: int, what: str, recoverable: bool = False) -> Any:
        """Worker ``w``'s answer; any failure marks it broken, except an error a
        ``recoverable`` command (``call``) reports, after which the worker goes on."""
        try:
            return self._answer(w, what)
        except (EnvError, ConfigError):
            if not recoverable:
                self._broken.add(w)
            raise
        except BaseException:  # died, too slow, or interrupted (Ctrl-C) before its answer
            self._broken.add(w)
            raise

    def _answer(self, w: int, what: str) -> Any:
        conn = self._conns[w]
        a, b = self._ranges[w]
        # Starting a worker imports its libraries, which the step timeout should not bound.
        timeout = max(self.timeout, STARTUP_TIMEOUT_S) if what == "ready" else self.timeout
        if not conn.poll(timeout):
            raise TimeoutError(
                f"environment worker {w} (envs {a}..{b - 1}) did not answer within "
                f"{timeout}s; raise BatchEnv(timeout=...) if its steps are that slow (call "
                f"restart_worker({w}) to go on)"
            )
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            raise self._died(w, starting=what == "ready") from None
        if kind == "error":
            index, tb = payload
            raise EnvError(f"environment {index} raised in its worker:\n{tb}")
        if kind == "refused":
            raise payload
        if kind not in (what, "ok"):
            raise RuntimeError(f"unexpected message {kind!r} from worker {w}")
        return payload

    def restart_worker(self, w: int, seed: int | None = None) -> None:
        """Replace worker ``w`` (after a :class:`WorkerError`); its environments start new
        episodes, reset with ``seed + i`` if given."""
        with contextlib.suppress(OSError):
            self._conns[w].close()
        if self._procs[w].is_alive():
            self._procs[w].kill()
        self._procs[w].join()
        self._broken.discard(w)
        self._pending[w] = False
        self._queued[w] = []
        self._ready = deque(i for i in self._ready if self._owner(i) != w)
        self._start(w)
        self._expect(w, "ready")
        a, b = self._ranges[w]
        self._conns[w].send(("reset", None if seed is None else [seed + i for i in range(a, b)]))
        self._expect(w, "ok")

    def _owner(self, env_id: int) -> int:
        return next(w for w, (a, b) in enumerate(self._ranges) if a <= env_id < b)

    def _outputs(self, ids) -> tuple:
        return (
            types.map_obs(lambda x: x[ids].copy(), self._buf["obs"]),
            self._buf["reward"][ids].copy(),
            self._buf["terminated"][ids].copy(),
            self._buf["truncated"][ids].copy(),
        )

    # ---------------------------------------------------------------------------- VectorEnv
    def reset(self, *, seed: int | Sequence[int] | None = None, options=None):
        """Reset every environment; environment ``i`` gets seed ``seed + i``."""
        self._check_open()
        self._drain()
        seeds = (
            [None] * self.num_envs
            if seed is None
            else ([seed + i for i in range(self.num_envs)] if isinstance(seed, int) else list(seed))
        )
        self._ready.clear()
        self._command(lambda w: ("reset", seeds[slice(*self._ranges[w])]))
        return types.map_obs(np.copy, self._buf["obs"]), {}

    def step(self, actions):
        self._check_open()
        self._drain()
        self._buf["action"][:] = actions
        self._command(lambda w: ("step", None))
        obs, reward, terminated, truncated = self._outputs(slice(None))
        return obs, reward, terminated, truncated, {}

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple:
        """Call method ``name`` of every environment (Gymnasium's ``VectorEnv.call``); results
        come back pickled over the pipes, so use it for control, not for every step."""
        return tuple(self._call(i, name, args, kwargs) for i in range(self.num_envs))

    def get_attr(self, name: str) -> tuple:
        """Attribute ``name`` of every environment."""
        return tuple(self._call(i, name, None, {}) for i in range(self.num_envs))

    def _call(self, env_id: int, name: str, args: tuple | None, kwargs: dict) -> Any:
        self._check_open()
        self._drain()
        w = self._owner(env_id)
        self._send(w, ("call", (env_id - self._ranges[w][0], name, args, kwargs)))
        return self._expect(w, "ok", recoverable=True)

    # ---------------------------------------------------------------------------- async
    def send(self, actions, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Start stepping ``env_ids`` (default: all) with ``actions``; do not wait. Send only
        environments that are not stepping (at the start, or just returned by ``recv``); a
        worker busy with others starts them as soon as it answers."""
        self._check_open()
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids, dtype=np.int64)
        self._refuse_broken({self._owner(int(i)) for i in ids})  # before anything is queued
        self._buf["action"][ids] = actions
        for w, (a, b) in enumerate(self._ranges):
            local = (ids[(ids >= a) & (ids < b)] - a).tolist()
            if local:
                self._queued[w].extend(local)
                self._dispatch(w)

    def _dispatch(self, w: int) -> None:
        """Send worker ``w`` its queued environments if it is idle."""
        if self._queued[w] and not self._pending[w]:
            self._send(w, ("step", self._queued[w]))
            self._queued[w] = []
            self._pending[w] = True

    def recv(self, batch_size: int | None = None):
        """The first ``batch_size`` environments that finished stepping:
        ``obs, reward, terminated, truncated, {"env_id": ids}``."""
        self._check_open()
        n = batch_size or self.batch_size
        while len(self._ready) < n:
            busy = [self._conns[w] for w in np.flatnonzero(self._pending)]
            if not busy:
                raise RuntimeError(
                    f"recv() wants {n} environments but only {len(self._ready)} are stepping; "
                    "send() more first"
                )
            ready = wait(busy, self.timeout)
            if not ready:
                raise TimeoutError(f"no environment finished stepping within {self.timeout}s")
            for conn in ready:
                w = self._conns.index(conn)
                self._pending[w] = False
                local = self._expect(w, "ok")
                a = self._ranges[w][0]
                self._ready.extend(a + i for i in local)
                self._dispatch(w)
        ids = np.array([self._ready.popleft() for _ in range(n)], dtype=np.int64)
        obs, reward, terminated, truncated = self._outputs(ids)
        return obs, reward, terminated, truncated, {"env_id": ids}

    def _drain(self) -> None:
        """Wait out asynchronous steps before a synchronous call."""
        for w in range(len(self._ranges)):
            while self._pending[w]:
                self._pending[w] = False
                self._expect(w, "ok")
                self._dispatch(w)
        self._ready.clear()

    # ---------------------------------------------------------------------------- closing
    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this BatchEnv is closed")

    def close(self, **kwargs) -> None:
        if getattr(self, "closed", True):
            return
        self.closed = True
        for conn in self._conns:
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.send(("close", None))
        for p in self._procs:
            if p is not None:
                p.join(timeout=2)
                if p.is_alive():
                    p.kill()
                    p.join()
        for conn in self._conns:
            if conn is not None:
                conn.close()
        for block in self._blocks.values():
            block.close()
            with contextlib.suppress(FileNotFoundError):
                block.unlink()
        _live.discard(self)

    def __enter__(self) -> BatchEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __getstate__(self):
        raise TypeError("a BatchEnv holds processes and shared memory; it cannot be pickled")


class ExternalProcess(gym.Env):
    """One environment built by ``constructor`` inside its own process (TensorFlow Agents'
    ``ExternalProcess``): ``step``, ``reset``, ``render`` and attribute reads are forwarded and
    wait for the result, with the same fault handling as :class:`BatchEnv` (``EnvError`` with
    the traceback, rlherd's refusals as themselves, ``WorkerError``, ``TimeoutError``, no
    orphans).

    Results travel pickled over a pipe, which suits one environment that must run apart (its own
    GIL, native code that may crash); to step many, use :class:`BatchEnv`, which moves them
    through shared memory.
    """

    def __init__(self, constructor: Callable[[], gym.Env], timeout: float = 60.0):
        self._batch = BatchEnv([constructor], num_workers=1, timeout=timeout)
        self.observation_space = self._batch.single_observation_space
        self.action_space = self._batch.single_action_space
        self.spec = self._batch.spec
        self.render_mode = self._batch._call(0, "render_mode", None, {})

    def step(self, action):
        return self._batch._call(0, "step", (action,), {})

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        return self._batch._call(0, "reset", (), dict(seed=seed, options=options))

    def render(self):
        return self._batch._call(0, "render", (), {})

    def get_wrapper_attr(self, name: str) -> Any:
        return self._batch._call(0, "get_wrapper_attr", (name,), {})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._batch._call(0, name, None, {})

    def close(self) -> None:
        if "_batch" in self.__dict__:
            self._batch.close()


_live: weakref.WeakSet[BatchEnv] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for env in list(_live):
        env.close()
