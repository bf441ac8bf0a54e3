"""Vector environment throughput: rlherd's BatchEnv (sync and async) against Gymnasium's
SyncVectorEnv and AsyncVectorEnv (and EnvPool where it installs), in one run.

Environments: CartPole-v1, ALE/Pong-v5 through Python wrappers (Gymnasium's AtariPreprocessing and
frame stack, as ``rlherd.make`` builds it), HalfCheetah-v5; with 2, 8 and 32 environments. Random
actions; steps/s counts environment steps. BatchEnv uses one worker per core; its async mode
keeps half the environments in flight (EnvPool's ``batch_size = num_envs / 2``).

Prints one JSON line per figure. Usage: python benchmarks/vector_env_throughput.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import gymnasium as gym
import numpy as np

from rlherd import envs
from rlherd.envs.vector import BatchEnv
from rlherd.run.provenance import machine

ENVS = ("CartPole-v1", "ALE/Pong-v5", "HalfCheetah-v5")  # EnvPool: Pong natively, HalfCheetah-v4
SIZES = (2, 8, 32)
MACHINE = machine()


def emit(**row):
    print(json.dumps(dict(bench="vector_env_throughput", **row, machine=MACHINE)), flush=True)


def actions_for(space: gym.Space, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.n, size=n)
    return rng.uniform(space.low, space.high, size=(n, *space.shape)).astype(space.dtype)


def run_sync(vec, n: int, seconds: float) -> float:
    rng = np.random.default_rng(0)
    vec.reset(seed=0)
    space = vec.single_action_space
    batches = [actions_for(space, n, rng) for _ in range(16)]
    steps, start, i = 0, time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        vec.step(batches[i % 16])
        steps, i = steps + n, i + 1
    return steps / (time.perf_counter() - start)


def run_async(vec: BatchEnv, n: int, seconds: float) -> float:
    rng = np.random.default_rng(0)
    vec.reset(seed=0)
    batch = max(1, n // 2)
    space = vec.single_action_space
    vec.send(actions_for(space, n, rng))
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        *_, info = vec.recv(batch)
        vec.send(actions_for(space, batch, rng), info["env_id"])
        steps += batch
    return steps / (time.perf_counter() - start)


def envpool_id(envpool, env_id: str) -> str:
    """EnvPool's name for an id (its Atari ids have no ``ALE/``; it may lag MuJoCo versions)."""
    name = env_id.removeprefix("ALE/")
    listed = set(envpool.list_all_envs())
    if name not in listed and name.replace("-v5", "-v4") in listed:
        return name.replace("-v5", "-v4")
    return name


def run_envpool_async(vec, n: int, seconds: float) -> float:
    rng = np.random.default_rng(0)
    vec.async_reset()
    space = vec.action_space
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        *_, info = vec.recv()
        ids = info["env_id"]
        vec.send(actions_for(space, len(ids), rng), ids)
        steps += len(ids)
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--envs", nargs="+", default=list(ENVS))
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    args = parser.parse_args()
    try:
        import envpool
    except ImportError:
        envpool = None
        emit(impl="envpool", note="not installed (pip install 'rlherd[bench]'); skipped")
    for env_id in args.envs:
        fn = functools.partial(envs.make, env_id)
        for n in args.sizes:
            fns = [fn] * n
            makers = {
                "gymnasium_sync": gym.vector.SyncVectorEnv,
                "gymnasium_async": gym.vector.AsyncVectorEnv,
                "batchenv_sync": BatchEnv,
                "batchenv_async": BatchEnv,
            }
            if envpool is not None:
                name = envpool_id(envpool, env_id)
                makers["envpool_sync"] = lambda _, name=name, n=n: envpool.make(
                    name, env_type="gymnasium", num_envs=n, seed=0
                )
                makers["envpool_async"] = lambda _, name=name, n=n: envpool.make(
                    name, env_type="gymnasium", num_envs=n, batch_size=max(1, n // 2), seed=0
                )
            for impl, make in makers.items():
                vec = make(fns)
                try:
                    run = {"batchenv_async": run_async, "envpool_async": run_envpool_async}.get(
                        impl, run_sync
                    )
                    sps = run(vec, n, args.seconds)
                finally:
                    vec.close()
                emit(env=env_id, num_envs=n, impl=impl, steps_per_s=round(sps, 1))


if __name__ == "__main__":
    main()
