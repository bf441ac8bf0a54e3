"""IMPALA throughput on this machine: raw environments, acting alone, end-to-end training.

For each environment (CartPole-v1 with the MLP, ALE/Pong-v5 with the shallow network) and each
runtime (``single``, ``mono``), all in one run so the ratios hold on a noisy machine:

  (a) raw_env   the same environments stepped with random actions on the same cores
                (single: one vector env of batch_size; mono: num_actors processes of
                envs_per_actor each);
  (b) acting    rlherd's actors writing rollouts with the model, the learner idle;
  (c) training  end-to-end ``rlherd.train`` agent steps/s (steady state, from learner.csv).

Prints one JSON line per figure. Usage: python benchmarks/impala_throughput.py [--seconds 8]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import tempfile
import time

import numpy as np
import torch
import torch.multiprocessing as mp

import rlherd
from rlherd import envs
from rlherd.agents import BUILDERS
from rlherd.agents.impala.acting import allocate_rollout, rollout_fields
from rlherd.run.train import resolve_config
from rlherd.runtime.mono import ActorPool

SETUPS = {
    # env id: (config overrides shared by both runtimes, total steps of the training run)
    "CartPole-v1": ({}, 200_000),
    "ALE/Pong-v5": (dict(num_actors=2, envs_per_actor=4, batch_size=8, unroll_length=80), 12_800),
}

MACHINE = dict(
    cpu=platform.processor() or platform.machine(),
    cores=os.cpu_count(),
    torch=torch.__version__,
    python=platform.python_version(),
)


def emit(**row) -> None:
    print(json.dumps(dict(bench="impala_throughput", **row, machine=MACHINE)), flush=True)


def frames(env_id: str, sps: float) -> dict:
    return {"frames_per_s": round(4 * sps, 1)} if env_id.startswith("ALE/") else {}


def raw_steps(env_id: str, num_envs: int, seconds: float, native: bool = True) -> float:
    torch.set_num_threads(1)
    vec = envs.make_vector(env_id, num_envs, native=native)
    vec.reset(seed=0)
    rng = np.random.default_rng(0)
    n = vec.single_action_space.n
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        vec.step(rng.integers(n, size=num_envs))
        steps += num_envs
    vec.close()
    return steps / (time.perf_counter() - start)


def _raw_worker(env_id: str, num_envs: int, seconds: float, out) -> None:
    out.put(raw_steps(env_id, num_envs, seconds))


def raw_steps_processes(env_id: str, procs: int, num_envs: int, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    workers = [
        ctx.Process(target=_raw_worker, args=(env_id, num_envs, seconds, out)) for _ in range(procs)
    ]
    for w in workers:
        w.start()
    total = sum(out.get() for _ in workers)
    for w in workers:
        w.join()
    return total


def acting_single(builder, spec, seconds: float) -> float:
    config = builder.config
    net = builder.make_networks(spec)
    actor = builder.make_actor(net, builder.make_envs(config.batch_size), seed=0)
    rollout = allocate_rollout(rollout_fields(spec, config.batch_size, config.unroll_length))
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        actor.unroll(rollout)
        steps += config.unroll_length * config.batch_size
    actor.envs.close()
    return steps / (time.perf_counter() - start)


def acting_mono(builder, spec, seconds: float) -> float:
    """Actor processes fill slots; the 'learner' only hands them back."""
    config = builder.config
    per_batch = config.unroll_length * config.batch_size
    with ActorPool(builder, spec, builder.make_networks(spec, device="cpu"), seed=0) as pool:
        pool.get_batch(lambda: False)  # wait until every actor is up and producing
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            pool.get_batch(lambda: False)
            pool.check()
            steps += per_batch
        return steps / (time.perf_counter() - start)


def training(env_id: str, runtime: str, overrides: dict, total_steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run = rlherd.train(
            "impala", env_id, runtime=runtime, total_steps=total_steps, run_dir=tmp,
            progress=False, checkpoint_interval_s=1e9, **overrides,
        )  # fmt: skip
        with open(os.path.join(tmp, "metrics", "learner.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
    skip = len(rows) // 5  # leave out start-up (process spawn, first compile of kernels)
    a, b = rows[skip], rows[-1]
    steady = (int(b["actor_steps"]) - int(a["actor_steps"])) / (
        float(b["learner_walltime"]) - float(a["learner_walltime"])
    )
    return dict(sps=round(steady, 1), sps_with_startup=run.summary["sps"], rows=rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8.0, help="per acting/raw measurement")
    parser.add_argument("--envs", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    args = parser.parse_args()
    torch.set_num_threads(1)

    for env_id in args.envs:
        overrides, total_steps = SETUPS[env_id]
        config, _ = resolve_config("impala", env_id, None, overrides)
        builder = BUILDERS["impala"](config, env_id)
        spec = envs.spec_for(env_id)
        B, k, n = config.batch_size, config.envs_per_actor, config.num_actors
        common = dict(
            env=env_id,
            torso="mlp" if not spec.is_image else "shallow",
            unroll=config.unroll_length,
            batch=B,
        )

        single = dict(runtime="single", num_envs=B)
        mono = dict(runtime="mono", num_envs=n * k, processes=n)
        t = args.seconds
        measurements = [
            ("raw_env", single, raw_steps, (env_id, B, t)),
            ("raw_env", mono, raw_steps_processes, (env_id, n, k, t)),
            ("acting", single, acting_single, (builder, spec, t)),
            ("acting", mono, acting_mono, (builder, spec, t)),
        ]
        for measure, where, measure_sps, measure_args in measurements:
            sps = measure_sps(*measure_args)
            emit(**common, measure=measure, **where, steps_per_s=round(sps, 1),
                 **frames(env_id, sps))  # fmt: skip

        for runtime in ("single", "mono"):
            result = training(env_id, runtime, overrides, total_steps)
            emit(
                **common,
                measure="training",
                runtime=runtime,
                steps_per_s=result["sps"],
                steps_per_s_with_startup=result["sps_with_startup"],
                **frames(env_id, result["sps"]),
            )


if __name__ == "__main__":
    main()
