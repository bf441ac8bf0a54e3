"""What running inside a Ray worker process costs an actor's loop: the same loop (8 CartPole
environments, a 64-64 MLP, a categorical sample, one torch thread) timed in CPU microseconds per
step in this process, in a spawned child process, in this process as Ray's driver, and in a Ray
actor. This is the part of `distributed`'s gap to `mono` that no change to rlherd's calls
can remove (docs/benchmarks/throughput.md).

Prints one JSON line per place. Usage: python benchmarks/ray_worker_cost.py [--steps 3000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time

import gymnasium as gym
import ray
import torch

from rlherd.run.provenance import machine


def loop(steps: int) -> float:
    """CPU microseconds of this thread per step of the loop."""
    torch.set_num_threads(1)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(8)])
    net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                              torch.nn.ReLU(), torch.nn.Linear(64, 2))  # fmt: skip
    obs, _ = envs.reset(seed=0)
    start = time.thread_time()
    with torch.no_grad():
        for _ in range(steps):
            logits = net(torch.as_tensor(obs))
            obs, *_ = envs.step(torch.distributions.Categorical(logits=logits).sample().numpy())
    return (time.thread_time() - start) / steps * 1e6


def _child(steps: int, out: mp.Queue) -> None:
    out.put(loop(steps))


@ray.remote
class LoopActor:
    def run(self, steps: int) -> float:
        return loop(steps)


def emit(place: str, times: list[float]) -> None:
    row = dict(bench="ray_worker_cost", place=place, cpu_us_per_step=round(min(times), 1),
               runs=[round(t, 1) for t in times], machine=machine())
    print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n, repeats = args.steps, args.repeats
    loop(n // 10)  # imports and first calls out of the way
    emit("process", [loop(n) for _ in range(repeats)])
    ctx = mp.get_context("spawn")
    times = []
    for _ in range(repeats):
        out = ctx.Queue()
        child = ctx.Process(target=_child, args=(n, out))
        child.start()
        times.append(out.get())
        child.join()
    emit("spawned_child", times)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        emit("ray_driver", [loop(n) for _ in range(repeats)])
        actor = LoopActor.remote()
        ray.get(actor.run.remote(n // 10))
        emit("ray_actor", [ray.get(actor.run.remote(n)) for _ in range(repeats)])
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
