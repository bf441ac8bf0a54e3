"""SAC's and TD3's learner updates per second against Stable-Baselines3's, on the same machine in
the same run, taking turns.

At one update per environment step (SAC's and TD3's update-to-data ratio, and
``benchmarks/control_suite.py``'s), the update is nearly all of a run's time: this measures it
alone. For each agent: rlherd's learner (``builder.make_learner``: sample a batch of 256 from the
replay table, the update, the Polyak step) and Stable-Baselines3's ``train(gradient_steps=K)``
with the same hyperparameters (the control_suite benchmark's: (256, 256) networks, batches of
256, Adam at 3e-4; TD3 updating its policy every second step), both on a replay of
``--transitions`` random transitions of ``--task``, one intra-op thread each. The two take turns
(``--slices`` per path, ``--seconds`` per path in all), since this kind of machine's speed
drifts within minutes, so the ratio holds even where the machine is shared.

Prints one JSON line per (agent, implementation) with updates/s, and one with their ratio.
Usage: python benchmarks/sac_td3_updates.py [--agents sac td3] [--seconds 30] [--slices 10]
       [--task dm_control/walker-walk-v0] [--transitions 10000]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np
import torch

from rlherd import envs as rl_envs
from rlherd.agents import BUILDERS
from rlherd.commands.train import resolve_config
from rlherd.run.provenance import machine


def random_transitions(task: str, count: int, seed: int = 0) -> list[tuple]:
    """``count`` transitions of uniformly random actions: (obs, action, reward, next_obs, done,
    truncated)."""
    env = rl_envs.make(task)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    out = []
    for _ in range(count):
        action = env.action_space.sample()
        next_obs, reward, term, trunc, _ = env.step(action)
        out.append((obs, action, float(reward), next_obs, term, trunc))
        obs = env.reset()[0] if term or trunc else next_obs
    return out


def rlherd_updates(agent: str, task: str, data: list[tuple]) -> Callable[[int], None]:
    """``run(k)``: ``k`` updates of rlherd's learner, on a table holding ``data``."""
    config, _ = resolve_config(agent, task, "control", {})
    builder = BUILDERS[agent](config)
    spec = rl_envs.spec_for(task)
    # A table holding a fixed dataset has no rate limit: the learner samples as fast as it can.
    tables = builder.make_replay_tables(spec, insert_blocking=False, dataset_size=len(data))
    adder = builder.make_adder(tables, 1)
    adder.add_first(data[0][0][None], np.ones(1, dtype=bool))
    for i, (_, action, reward, next_obs, term, trunc) in enumerate(data):
        adder.add(action[None], np.array([reward]), next_obs[None], np.array([term]),
                  np.array([trunc]), np.zeros(1, dtype=bool))  # fmt: skip
        if (term or trunc) and i + 1 < len(data):
            adder.add_first(data[i + 1][0][None], np.ones(1, dtype=bool))
    learner = builder.make_learner(builder.make_networks(spec), builder.make_dataset(tables),
                                   len(data), tables)  # fmt: skip

    def run(k: int) -> None:
        for _ in range(k):
            learner.step()

    return run


def sb3_updates(agent: str, task: str, data: list[tuple]) -> Callable[[int], None]:
    """``run(k)``: Stable-Baselines3's ``train(gradient_steps=k)`` on a buffer holding ``data``."""
    from stable_baselines3 import SAC, TD3
    from stable_baselines3.common.logger import configure

    env = rl_envs.make(task)
    common = dict(learning_rate=3e-4, batch_size=256, tau=0.005, gamma=0.99,
                  policy_kwargs=dict(net_arch=[256, 256]), seed=0, device="cpu")  # fmt: skip
    if agent == "sac":
        model = SAC("MlpPolicy", env, ent_coef="auto", **common)
    else:
        model = TD3("MlpPolicy", env, policy_delay=2, target_policy_noise=0.2,
                    target_noise_clip=0.5, **common)  # fmt: skip
    model.set_logger(configure(None, []))
    for obs, action, reward, next_obs, term, trunc in data:
        model.replay_buffer.add(obs[None], next_obs[None], action[None], np.array([reward]),
                                np.array([term]), [{"TimeLimit.truncated": trunc}])  # fmt: skip

    def run(k: int) -> None:
        model.train(gradient_steps=k, batch_size=256)

    return run


def measure(paths: dict[str, Callable[[int], None]], seconds: float, slices: int) -> dict:
    """Updates per second of each path, the paths taking ``slices`` turns of equal time."""
    for run in paths.values():  # warm up: first allocations, Adam's state
        run(20)
    done = dict.fromkeys(paths, 0)
    spent = dict.fromkeys(paths, 0.0)
    for _ in range(slices):
        for name, run in paths.items():
            start = time.perf_counter()
            while time.perf_counter() - start < seconds / slices:
                run(10)
                done[name] += 10
            spent[name] += time.perf_counter() - start
    return {name: done[name] / spent[name] for name in paths}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", nargs="+", default=["sac", "td3"], choices=["sac", "td3"])
    parser.add_argument("--task", default="dm_control/walker-walk-v0")
    parser.add_argument("--transitions", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30.0, help="per path")
    parser.add_argument("--slices", type=int, default=10, help="turns per path")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = random_transitions(args.task, args.transitions)
    about = dict(bench="sac_td3_updates", task=args.task, batch_size=256, machine=machine())
    for agent in args.agents:
        rates = measure({"rlherd": rlherd_updates(agent, args.task, data),
                         "sb3": sb3_updates(agent, args.task, data)},
                        args.seconds, args.slices)  # fmt: skip
        for name, rate in rates.items():
            print(json.dumps(dict(about, agent=agent, implementation=name,
                                  updates_per_s=round(rate, 1))))  # fmt: skip
        print(json.dumps(dict(about, agent=agent,
                              rlherd_over_sb3=round(rates["rlherd"] / rates["sb3"], 3))))


if __name__ == "__main__":
    main()
