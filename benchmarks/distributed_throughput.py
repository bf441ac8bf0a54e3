"""The distributed runtime against mono on the same machine, and its replay node against an
in-process table, in the same run.

1. Replay: items inserted per second (CartPole n-step transitions, in an actor's chunks) and
   items sampled per second (batches of 64) into / from an in-process :class:`Table`, then
   through a replay node on a local Ray (:class:`InsertClient` / :class:`TableClient`, the
   clients the actors and the learner use).
2. Where a DQN learner step's time goes: learner steps per second on batches from an in-process
   table, and on a learner node sampling from a replay node (no actors; the table is full and
   its limiter never blocks), in ``--learner-rounds`` rounds taken turn about; the last line
   gives each round's ratio and their median.
3. Agent steps per second of whole runs (`rlherd train`, in subprocesses, one at a time):
   IMPALA on CartPole-v1 and on ALE/Pong-v5 with ``distributed`` and with ``mono``, the same
   actors and environments per actor. Ray's start (about 10 s here) is not in steps/s: the rate
   is taken over the run's second half from ``metrics/train.csv``. Runs come in ``--pairs``
   alternating pairs (``mono``, then ``distributed``), so a slow spell of a shared machine
   falls on both runtimes; the last line per environment gives each pair's ratio and their
   median (on a 2-core VM, Pong's ratio went from 0.79 to 0.91 between the pairs of one run).

``--against REV`` first runs this benchmark as it is at the git revision ``REV`` (its own code,
from a temporary worktree), in the same invocation, so a change is measured against the code
before it on the same machine; its lines carry ``"code": REV``, this code's ``"code": "here"``.

Prints one JSON line per figure. Usage:
    python benchmarks/distributed_throughput.py [--seconds 5] [--cartpole-steps 200000]
        [--pong-steps 100000] [--pairs 3] [--learner-rounds 5] [--skip-runs] [--against REV]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import ray
import torch

from rlherd import envs as rl_envs
from rlherd.agents import BUILDERS
from rlherd.replay import MinSize, NStepTransitionAdder, Table, Uniform
from rlherd.run.provenance import machine
from rlherd.runtime.program import InsertClient, LearnerNode, NodeSetup, ReplayNode, TableClient
from rlherd.runtime.settings import Distributed

MACHINE = machine()
CHUNK, BATCH, CAPACITY = 64, 64, 100_000


CODE = "here"
ROOT = Path(__file__).resolve().parent.parent  # the repository whose revisions --against runs


def emit(**row) -> None:
    print(json.dumps(dict(bench="distributed_throughput", code=CODE, **row, machine=MACHINE)),
          flush=True)  # fmt: skip


def knows(rev: str, flag: str) -> bool:
    """Whether this benchmark at ``rev`` takes ``flag``."""
    path = f"{rev}:benchmarks/{Path(__file__).name}"
    code = subprocess.run(["git", "-C", str(ROOT), "show", path], capture_output=True,
                          text=True).stdout  # fmt: skip
    return f'"{flag}"' in code


def against(rev: str, argv: list[str]) -> None:
    """This benchmark at ``rev``, run from a temporary worktree; its lines tagged with ``rev``."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
                       check=True, capture_output=True)  # fmt: skip
        try:
            env = dict(os.environ, PYTHONPATH=str(tree))
            out = subprocess.run([sys.executable, "benchmarks/distributed_throughput.py", *argv],
                                 cwd=tree, env=env, check=True, capture_output=True, text=True)
            for line in out.stdout.splitlines():
                row = json.loads(line)
                print(json.dumps({"code": rev, **{k: v for k, v in row.items() if k != "code"}}),
                      flush=True)  # fmt: skip
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False, capture_output=True)  # fmt: skip


def cartpole_tables() -> list[Table]:
    signature = NStepTransitionAdder.signature(rl_envs.spec_for("CartPole-v1"))
    return [Table("replay", signature, CAPACITY, Uniform(), rate_limiter=MinSize(1))]


def items(n: int) -> dict[str, np.ndarray]:
    signature = cartpole_tables()[0].signature
    rng = np.random.default_rng(0)
    return {k: rng.random((n, *shape)).astype(dt) for k, (shape, dt) in signature.items()}


def rate(fn, seconds: float) -> float:
    """Calls of ``fn`` per second (it returns how many items each call moved)."""
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        done += fn()
    return done / (time.perf_counter() - start)


def replay(seconds: float) -> None:
    data = items(CHUNK)
    rows = [{k: v[i] for k, v in data.items()} for i in range(CHUNK)]
    (table,) = cartpole_tables()

    def insert_local() -> int:
        for row in rows:
            table.insert(row)
        return CHUNK

    emit(figure="inserts_per_s", where="in-process table", value=round(rate(insert_local, seconds)))
    emit(figure="samples_per_s", where="in-process table",
         value=round(rate(lambda: len(table.sample(BATCH).keys), seconds)))  # fmt: skip
    node = ray.remote(ReplayNode).options(max_concurrency=4).remote(cartpole_tables)
    ray.get(node.ready.remote())
    client = InsertClient(node, 0, None, CHUNK, threading.Event())

    def insert_remote() -> int:
        for row in rows:
            client.insert(row)
        return CHUNK

    per_s = rate(insert_remote, seconds)
    client.settle()
    emit(figure="inserts_per_s", where="replay node", value=round(per_s),
         items_per_call=round(client.sent / client.calls, 1))  # fmt: skip
    sampler = TableClient(node, 0, "replay", Distributed().sample_prefetch)
    emit(figure="samples_per_s", where="replay node",
         value=round(rate(lambda: len(sampler.sample(BATCH).keys), seconds)))  # fmt: skip
    ray.kill(node)


def learner(seconds: float, rounds: int) -> None:
    """DQN learner steps/s in process and on a learner node, in ``rounds`` alternating rounds of
    ``seconds`` each: one 5-second figure on a shared 2-core VM spread by a quarter from one
    invocation to the next, so only rounds taken turn about compare the two."""
    builder = BUILDERS["dqn"](BUILDERS["dqn"].config_class(batch_size=BATCH, prioritized=False))
    spec = rl_envs.spec_for("CartPole-v1")
    (table,) = cartpole_tables()
    data = items(10_000)
    for i in range(10_000):
        table.insert({k: v[i] for k, v in data.items()})
    dataset = builder.make_dataset([table])
    local = builder.make_learner(builder.make_networks(spec), dataset, 10**6, [table])

    def filled() -> list[Table]:
        tables = cartpole_tables()
        for i in range(10_000):
            tables[0].insert({k: v[i] for k, v in data.items()})
        return tables

    node = ray.remote(ReplayNode).options(max_concurrency=4).remote(filled)
    setup = NodeSetup(builder, spec, "CartPole-v1", {}, Distributed())
    remote = ray.remote(LearnerNode).options(max_concurrency=4).remote(setup, node, 10**6, 0)
    ray.get(remote.ready.remote())
    ray.get(remote.train.remote(0.5))  # its first batches, in flight from then on

    def on_node() -> float:
        start, steps = time.perf_counter(), 0
        while (left := seconds - (time.perf_counter() - start)) > 0:
            steps += ray.get(remote.train.remote(min(0.5, left)))[0]  # (steps, metrics)
        return steps / (time.perf_counter() - start)

    def in_process() -> int:
        local.step()
        return 1

    rate(in_process, 0.5)  # its first steps too, before either is measured
    here, there = [], []
    for _ in range(rounds):
        here.append(rate(in_process, seconds))
        there.append(on_node())
    ray.kill(remote)
    ray.kill(node)
    emit(figure="dqn_learner_steps_per_s", where="in-process table", rounds=rounds,
         value=round(float(np.mean(here)), 1))  # fmt: skip
    emit(figure="dqn_learner_steps_per_s", where="learner node + replay node", rounds=rounds,
         value=round(float(np.mean(there)), 1))  # fmt: skip
    ratios = [b / a for a, b in zip(here, there, strict=True)]
    emit(figure="dqn_learner_node_over_in_process", ratios=[round(r, 3) for r in ratios],
         median=round(float(np.median(ratios)), 3))  # fmt: skip


def second_half_sps(run_dir: Path) -> float:
    rows = list(csv.DictReader(open(run_dir / "metrics" / "train.csv")))
    half = [r for r in rows if float(r["actor_steps"]) >= float(rows[-1]["actor_steps"]) / 2]
    steps = float(half[-1]["actor_steps"]) - float(half[0]["actor_steps"])
    wall = float(half[-1]["wall_time_s"]) - float(half[0]["wall_time_s"])
    return steps / wall if wall > 0 else float("nan")


def training(env_id: str, runtime: str, total_steps: int, *flags: str) -> float:
    """One ``rlherd train impala`` run: its figures as a line, and its steady steps/s."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "rlherd.cli", "train", "impala", "--env", env_id,
               "--runtime", runtime, "--total-steps", str(total_steps), "--run-dir",
               str(run_dir), "--no-progress", *flags]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        summary = json.loads((run_dir / "summary.json").read_text())
        steady = second_half_sps(run_dir)
        emit(figure="impala_agent_steps_per_s", env=env_id, runtime=runtime, steps=total_steps,
             flags=" ".join(flags), steady_sps=round(steady, 1), run_sps=summary["sps"],
             wall_s=round(time.perf_counter() - start, 1),
             final_return_mean=summary["final_return_mean"])  # fmt: skip
        return steady


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--cartpole-steps", type=int, default=200_000)
    parser.add_argument("--pong-steps", type=int, default=100_000)
    parser.add_argument("--pairs", type=int, default=3, help="alternating mono/distributed pairs")
    parser.add_argument("--learner-rounds", type=int, default=5,
                        help="alternating in-process / learner-node rounds")  # fmt: skip
    parser.add_argument("--skip-runs", action="store_true")
    parser.add_argument("--against", metavar="REV", help="also run this benchmark at REV, first")
    args = parser.parse_args()
    if args.pairs < 1 or args.learner_rounds < 1:
        parser.error("--pairs and --learner-rounds must be at least 1")
    if not args.seconds > 0:  # nan too
        parser.error("--seconds must be above 0")
    if args.against:
        rest = ["--seconds", str(args.seconds), "--cartpole-steps", str(args.cartpole_steps),
                "--pong-steps", str(args.pong_steps)]  # fmt: skip
        rest += ["--skip-runs"] if args.skip_runs else []
        for flag, value in (("--pairs", args.pairs), ("--learner-rounds", args.learner_rounds)):
            if knows(args.against, flag):  # older code has one pair, one round, and no such flag
                rest += [flag, str(value)]
        against(args.against, rest)
    torch.set_num_threads(1)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
    try:
        replay(args.seconds)
        learner(args.seconds, args.learner_rounds)
    finally:
        ray.shutdown()
    if args.skip_runs:
        return
    for env_id, steps in (("CartPole-v1", args.cartpole_steps), ("ALE/Pong-v5", args.pong_steps)):
        layout = ("--num-actors", "2", "--envs-per-actor", "8")
        ratios = []
        for _ in range(args.pairs):
            sps = {rt: training(env_id, rt, steps, *layout) for rt in ("mono", "distributed")}
            ratios.append(sps["distributed"] / sps["mono"])
        emit(figure="impala_distributed_over_mono", env=env_id, pairs=args.pairs,
             ratios=[round(r, 3) for r in ratios], median=round(float(np.median(ratios)), 3))


if __name__ == "__main__":
    main()
