"""PolyBeast on this machine: ``poly`` against ``mono`` end to end, and the cost of the gRPC hop.

All in one run, so the ratios hold on a noisy machine:

  (a) training   end-to-end ``rlherd.train`` agent steps/s of IMPALA on ``poly`` (local servers
                 on Unix sockets, actor threads, dynamic batching) and on ``mono`` (actor
                 processes), with the same model, batch, unroll and number of actors; poly also
                 reports its mean inference batch size and policy lag.
  (b) grpc_hop   steps/s of one environment through one stream to a server process (TCP
                 loopback and Unix socket) against stepping the same environment in this process.

Prints one JSON line per figure.
Usage: python benchmarks/poly_throughput.py [--seconds 5] [--envs CartPole-v1 ALE/Pong-v5]
       [--total-steps N] [--no-training]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from impala_throughput import MACHINE, SETUPS, frames, training  # benchmarks/ is on sys.path

from rlherd import envs


def emit(**row) -> None:
    print(json.dumps(dict(bench="poly_throughput", **row, machine=MACHINE)), flush=True)


def poly_figures(rows: list[dict]) -> dict:
    """Mean inference batch size and policy lag of a poly run, from its learner.csv."""
    return dict(
        inference_batch_size=round(float(rows[-1]["inference_batch_size"]), 2),
        policy_lag=round(float(np.mean([float(r["policy_lag"]) for r in rows])), 2),
    )


def in_process(env_id: str, seconds: float) -> float:
    env = envs.make(env_id)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        if terminated or truncated:
            env.reset()
        steps += 1
    env.close()
    return steps / (time.perf_counter() - start)


def through_stream(env_id: str, address: str, seconds: float) -> float:
    """Steps/s of one environment served by ``rlherd serve-env`` in its own process."""
    from rlherd.envs.server import EnvStream

    server = subprocess.Popen(
        [sys.executable, "-m", "rlherd.envs.server", env_id, "--address", address],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        stream = EnvStream(server.stdout.readline().split()[-1], seed=0)  # "serving ... on ADDR"
        rng = np.random.default_rng(0)
        n = stream.action_space.n
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            stream.step(rng.integers(n, size=1))
            steps += 1
        sps = steps / (time.perf_counter() - start)
        stream.close()
    finally:
        server.terminate()
        server.wait()
        server.stdout.close()
    return sps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="per gRPC-hop measurement")
    parser.add_argument("--envs", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--no-training", action="store_true", help="only the gRPC hop")
    parser.add_argument(
        "--total-steps", type=int, help="agent steps of each training run (default: per env)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)

    for env_id in args.envs:
        total_steps = args.total_steps or SETUPS[env_id][-1]
        common = dict(env=env_id)
        for runtime in () if args.no_training else ("poly", "mono"):
            result = training(env_id, runtime, total_steps)
            extra = poly_figures(result["rows"]) if runtime == "poly" else {}
            emit(**common, measure="training", runtime=runtime, steps_per_s=result["sps"],
                 steps_per_s_with_startup=result["sps_with_startup"],
                 **frames(env_id, result["sps"]), **extra)  # fmt: skip

        with tempfile.TemporaryDirectory() as tmp:
            base = in_process(env_id, args.seconds)
            emit(**common, measure="grpc_hop", where="in_process", num_envs=1,
                 steps_per_s=round(base, 1))  # fmt: skip
            for where, address in (
                ("grpc_tcp_loopback", "127.0.0.1:0"),
                ("grpc_unix_socket", f"unix:{tmp}/bench.sock"),
            ):
                sps = through_stream(env_id, address, args.seconds)
                emit(
                    **common,
                    measure="grpc_hop",
                    where=where,
                    num_envs=1,
                    steps_per_s=round(sps, 1),
                    relative_to_in_process=round(sps / base, 3),
                )
                # fmt: skip


if __name__ == "__main__":
    main()
