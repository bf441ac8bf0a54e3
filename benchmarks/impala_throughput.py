"""IMPALA throughput on this machine: raw environments, acting alone, where an agent step's time
goes, and end-to-end training.

For each environment (CartPole-v1 with the MLP, ALE/Pong-v5 with the shallow network), each
layout of actors (Pong: 2 actors of 1 and of 8 environments, batch 8, unroll 80, as in
TorchBeast's MonoBeast comparison) and each torso precision (Pong: float32, as before, and
bfloat16), all in one run so the ratios hold on a noisy machine:

  (a) raw_env    the same environments stepped with random actions on the same cores
                 (single: one vector env of batch_size; mono: num_actors processes of
                 envs_per_actor each);
  (b) acting     rlherd's actors writing rollouts with the model, wired as each runtime wires
                 them, the learner idle (it takes each batch and learns nothing);
  (c) breakdown  microseconds of one CPU per agent step: the actor's model, the environment,
                 the rollout writes and the rest of the actor's loop (one actor in this process,
                 envs_per_actor environments), and the learner's update (forward, backward and
                 optimiser over a batch, per agent step it consumes); with the mono run's
                 steady rate, ``other_us`` is what is left of the machine's cores per agent step:
                 waiting on queues and pipes, idle cores, contention;
  (d) training   end-to-end ``rlherd.train`` agent steps/s (steady state, from learner.csv).

Prints one JSON line per figure.
Usage: python benchmarks/impala_throughput.py [--seconds 8] [--envs ALE/Pong-v5]
         [--layouts 1 8] [--precisions float32 bfloat16] [--total-steps N] [--runtimes mono]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile
import threading
import time

import numpy as np
import torch
import torch.multiprocessing as mp

import rlherd
from rlherd import envs
from rlherd.agents import BUILDERS
from rlherd.commands.train import resolve_config
from rlherd.replay.rollouts import (
    RolloutQueue,
    RolloutWriter,
    allocate_rollout,
    join,
    rollout_layout,
)
from rlherd.run.loop import ActorAlgorithm, EnvironmentLoop
from rlherd.run.provenance import machine
from rlherd.runtime import RunContext, make_envs
from rlherd.runtime.mono import ActorPool, SharedVariables, rollout_slots
from rlherd.runtime.settings import resolve as resolve_settings

SETUPS = {
    # env id: (agent config overrides, settings of the runtimes with actors (mono, poly),
    #          envs_per_actor layouts (None: the preset's), total steps of a training run);
    #          the preset's suggestions fill in the rest.
    "CartPole-v1": ({}, {}, [None], 200_000),
    "ALE/Pong-v5": (dict(batch_size=8, unroll_length=80), dict(num_actors=2), [1, 8], 57_600),
}

MACHINE = machine()


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


class IdleLearner:
    """Stands in for the learner: each step takes a batch from the dataset and learns nothing."""

    def __init__(self, dataset):
        self.dataset = dataset

    def step(self) -> dict[str, float]:
        next(self.dataset)
        return {}


def acting_single(builder, spec, env_id: str, settings, seconds: float) -> float:
    """The single runtime's wiring (rollouts queued in process), with an idle learner."""
    num_envs = settings.num_envs or builder.batch_size
    policy = builder.make_policy(builder.make_networks(spec))
    layout = rollout_layout(spec, builder.rollout_fields(spec))
    buffer = allocate_rollout(layout, builder.unroll_length, num_envs,
                              policy.initial_state(num_envs))  # fmt: skip
    queue = RolloutQueue(buffer, builder.batch_size // num_envs)
    actor = builder.make_actor(0, policy, spec, queue, None)  # no learner to fetch weights from
    algorithm = ActorAlgorithm(actor, IdleLearner(queue), queue.ready)
    loop = EnvironmentLoop(make_envs(env_id, {}, settings, num_envs, settings.env_workers),
                           algorithm, seed=0)  # fmt: skip
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        steps += loop.step()
    loop.envs.close()
    return steps / (time.perf_counter() - start)


class _Reports:
    """The recorder the actor processes report their steps and episodes to (here: nobody)."""

    def add_actor_steps(self, n: int) -> None:
        pass

    def episodes(self, returns: np.ndarray, lengths: np.ndarray) -> None:
        pass


def acting_mono(builder, spec, env_id: str, settings, seconds: float) -> float:
    """The mono runtime's actor processes fill shared-memory slots; the learner only joins
    full slots into batches and hands them back."""
    source = SharedVariables(builder.make_networks(spec, "cpu"))
    dataset, slots = rollout_slots(builder, spec, settings, source)
    ctx = RunContext(builder, env_id, {}, spec, settings, _Reports(), seed=0, checkpoint=None,
                     save=lambda state: None, stop=threading.Event())  # fmt: skip
    pool = dataset.pool = ActorPool(ctx, source, [], slots, seed=0)
    learner = IdleLearner(dataset)

    def learn() -> None:
        while True:
            pool.check()
            try:
                return learner.step()
            except TimeoutError:  # no full batch yet
                pass

    try:
        learn()  # wait until the actors are up and producing
        while not all(link.started for link in pool.links):
            learn()
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            learn()
            steps += builder.unroll_length * builder.batch_size
        return steps / (time.perf_counter() - start)
    finally:
        pool.close()


def breakdown(builder, spec, env_id: str, settings, seconds: float) -> dict[str, float]:
    """Microseconds of one CPU per agent step: the model, the environment, the rollout writes
    and the rest of one actor's loop over ``envs_per_actor`` environments, then the learner's
    update on a batch of the rollouts it wrote."""
    k = settings.envs_per_actor
    spent: dict[str, float] = dict(model=0.0, env=0.0, rollout_write=0.0)

    def timed(name, fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            spent[name] += time.perf_counter() - start
            return out

        return call

    policy = builder.make_policy(builder.make_networks(spec))
    layout = rollout_layout(spec, builder.rollout_fields(spec))
    buffer = allocate_rollout(layout, builder.unroll_length, k, policy.initial_state(k))
    rollouts: list[dict] = []

    def keep(full):
        rollouts.append({name: v.clone() for name, v in full.items()})
        return full

    writer = RolloutWriter(buffer, keep)
    writer.add_row, writer.add_outcome = (timed("rollout_write", writer.add_row),
                                          timed("rollout_write", writer.add_outcome))  # fmt: skip
    timed_policy = _TimedPolicy(policy, timed("model", policy.__call__))
    actor = builder.make_actor(0, timed_policy, spec, writer, None)
    vec = make_envs(env_id, {}, settings, k, 0)
    vec.step = timed("env", vec.step)
    loop = EnvironmentLoop(vec, actor, seed=0)
    for _ in range(max(1, 200 // k)):  # warm up
        loop.step()
    for name in spent:
        spent[name] = 0.0
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or len(rollouts) * k < builder.batch_size:
        steps += loop.step()
    total = time.perf_counter() - start
    vec.close()
    out = {f"{name}_us": round(v / steps * 1e6, 1) for name, v in spent.items()}
    out["actor_loop_us"] = round((total - sum(spent.values())) / steps * 1e6, 1)

    batch = join(rollouts[-(builder.batch_size // k):])
    learner = builder.make_learner(builder.make_networks(spec), iter(()), 10**9, [])
    learner.learn(batch)  # warm up
    start = time.perf_counter()
    for _ in range(3):
        learner.learn(batch)
    per_batch = (time.perf_counter() - start) / 3
    out["learner_update_us"] = round(per_batch / (builder.unroll_length * builder.batch_size)
                                     * 1e6, 1)  # fmt: skip
    return out


class _TimedPolicy:
    """The policy with its calls timed; everything else as the policy's."""

    def __init__(self, policy, call):
        self.policy, self.call = policy, call

    def __call__(self, *args):
        return self.call(*args)

    def __getattr__(self, name):
        return getattr(self.policy, name)


def training(env_id: str, runtime: str, total_steps: int, overrides: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run = rlherd.train(
            "impala", env_id, runtime=runtime, total_steps=total_steps, run_dir=tmp,
            progress=False, checkpoint_interval_s=1e9, log_interval_s=1.0, **overrides,
        )  # fmt: skip
        with open(os.path.join(tmp, "metrics", "learner.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
    if len(rows) < 2:
        raise ValueError(f"{total_steps} steps made {len(rows)} learner row(s); raise them")
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
    parser.add_argument("--layouts", nargs="+", type=int,
                        help="envs_per_actor layouts (default: per env)")  # fmt: skip
    parser.add_argument("--precisions", nargs="+", choices=["float32", "bfloat16"],
                        help="torso precisions (default: both for Pong, float32 for CartPole)")
    parser.add_argument("--runtimes", nargs="+", default=["single", "mono"],
                        choices=["single", "mono"])  # fmt: skip
    parser.add_argument(
        "--total-steps", type=int, help="agent steps of each training run (default: per env)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)

    for env_id in args.envs:
        agent, actors, layouts, total_steps = SETUPS[env_id]
        spec = envs.spec_for(env_id)
        precisions = args.precisions or (["float32", "bfloat16"] if spec.is_image
                                         else ["float32"])  # fmt: skip
        for k in args.layouts or layouts:
            for precision in precisions:
                overrides = dict(agent, precision=precision)
                config, preset = resolve_config("impala", env_id, None, overrides)
                builder = BUILDERS["impala"](config)
                suggested = builder.runtime_defaults.get(preset, {})
                layout = dict(actors, **({} if k is None else dict(envs_per_actor=k)))
                single_settings = resolve_settings("single", suggested, {})
                mono_settings = resolve_settings("mono", suggested, layout)
                figures(env_id, builder, spec, precision, single_settings, mono_settings,
                        overrides, layout, args)  # fmt: skip


def figures(env_id, builder, spec, precision, single_settings, mono_settings, overrides, layout,
            args):  # fmt: skip
    """Every figure of one environment, layout (the actors' settings) and precision."""
    B = single_settings.num_envs or builder.batch_size
    k, n = mono_settings.envs_per_actor, mono_settings.num_actors
    common = dict(env=env_id, torso="mlp" if not spec.is_image else "shallow",
                  unroll=builder.unroll_length, batch=builder.batch_size, precision=precision,
                  envs_per_actor=k, num_actors=n)  # fmt: skip
    t = args.seconds
    single = dict(runtime="single", num_envs=B)
    mono = dict(runtime="mono", num_envs=n * k, processes=n)
    measurements = [("acting", mono, acting_mono, (builder, spec, env_id, mono_settings, t))]
    if precision == "float32":  # environments do not depend on the model's precision
        measurements.insert(0, ("raw_env", mono, raw_steps_processes, (env_id, n, k, t)))
    if "single" in args.runtimes:
        measurements += [
            ("raw_env", single, raw_steps, (env_id, B, t)),
            ("acting", single, acting_single, (builder, spec, env_id, single_settings, t)),
        ]
    for measure, where, measure_sps, measure_args in measurements:
        sps = measure_sps(*measure_args)
        emit(**common, measure=measure, **where, steps_per_s=round(sps, 1),
             **frames(env_id, sps))  # fmt: skip
    parts = breakdown(builder, spec, env_id, mono_settings, t)
    for runtime in args.runtimes:
        result = training(env_id, runtime, args.total_steps or SETUPS[env_id][3],
                          dict(overrides, **layout) if runtime == "mono" else overrides)
        row = dict(**common, measure="training", runtime=runtime, steps_per_s=result["sps"],
                   steps_per_s_with_startup=result["sps_with_startup"],
                   **frames(env_id, result["sps"]))  # fmt: skip
        if runtime == "mono":
            cpu_us = (os.cpu_count() or 1) * 1e6 / result["sps"]
            actor = sum(v for name, v in parts.items() if name != "learner_update_us")
            used = actor + parts["learner_update_us"]
            emit(**common, measure="breakdown", runtime="mono", **parts,
                 other_us=round(cpu_us - used, 1), cpu_us_per_step=round(cpu_us, 1))  # fmt: skip
        emit(**row)


if __name__ == "__main__":
    main()
