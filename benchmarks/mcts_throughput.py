"""MCTS search throughput: simulations and agent steps per second, one batched search over ``B``
environments against ``B`` searches of one tree each (the same code with a batch of one, which
is how an unbatched MCTS such as Acme's runs), in one run so the ratios hold.

Each agent step searches ``--simulations`` simulations from every environment with an untrained
policy-value network (what is measured does not depend on its values), then steps the
environments with the chosen actions, as an actor does. Models: ``simulator`` (copies of the
environment) and ``learned`` (the MLP transition model). Prints one JSON line per (env, model,
batch, mode). Usage:
  python benchmarks/mcts_throughput.py [--seconds 10] [--batches 1 8 32] [--simulations 50]
      [--envs CartPole-v1 rlherd/DeepSea-v0] [--models simulator learned]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from rlherd import envs as rl_envs
from rlherd.agents import BUILDERS
from rlherd.commands.train import resolve_config
from rlherd.run.provenance import machine

MACHINE = machine()


def make_actor(env_id: str, model: str, simulations: int, envs):
    """A training actor (no adder) bound to ``envs``; greedy off, so it samples as in training."""
    config, _ = resolve_config("mcts", env_id, None, {"model": model,
                                                      "num_simulations": simulations})  # fmt: skip
    builder = BUILDERS["mcts"](config)
    spec = rl_envs.spec_of(envs[0], env_id)
    torch.manual_seed(0)  # every actor the same network: the same trees, batched or not
    policy = builder.make_policy(builder.make_networks(spec), evaluation=False)
    actor = builder.make_actor(0, policy, spec, None, None)
    actor.bind_environments(envs)
    return actor


def measure(env_id: str, model: str, batch: int, batched: bool, simulations: int,
            seconds: float) -> dict:  # fmt: skip
    """Agent steps of ``batch`` environments for about ``seconds``: one actor searching all of
    them at once, or ``batch`` actors of one environment each, taking turns."""
    envs = [rl_envs.make(env_id) for _ in range(batch)]
    obs = np.stack([env.reset(seed=i)[0] for i, env in enumerate(envs)])
    groups = [list(range(batch))] if batched else [[i] for i in range(batch)]
    actors = [make_actor(env_id, model, simulations, [envs[i] for i in g]) for g in groups]
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for actor, group in zip(actors, groups, strict=True):
            actions = actor.select_action(obs[group])
            for i, action in zip(group, actions, strict=True):
                o, _, terminated, truncated, _ = envs[i].step(action)
                obs[i] = envs[i].reset()[0] if terminated or truncated else o
        steps += batch
    elapsed = time.perf_counter() - start
    return dict(env=env_id, model=model, batch=batch, mode="batched" if batched else "unbatched",
                simulations=simulations, agent_steps_per_s=round(steps / elapsed, 1),
                simulations_per_s=round(steps * simulations / elapsed, 1), **MACHINE)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--simulations", type=int, default=50)
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "rlherd/DeepSea-v0"])
    parser.add_argument("--models", nargs="+", default=["simulator", "learned"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    for env_id in args.envs:
        for model in args.models:
            rates = {}
            for batch in args.batches:
                for batched in ([True, False] if batch > 1 else [True]):
                    row = measure(env_id, model, batch, batched, args.simulations, args.seconds)
                    rates[batched] = row["simulations_per_s"]
                    if not batched:
                        row["batched_over_unbatched"] = round(rates[True] / rates[False], 2)
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
