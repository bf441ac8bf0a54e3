"""WarpDrive's benchmark on this machine: the Tag games on a torch device against their numpy
references, end-to-end device training, and the device sampler against torch.distributions.

All in one run, on ``--device`` (cpu here; cuda where a GPU is lent):

  (a) env_step   environment steps/s (one step of one game) and agent steps/s (x agents) of the
                 device games for 1, 100, 1000 and 2000 games with 5 and 105 agents (and 1000
                 agents for the grid), next to the numpy reference stepping the same number of
                 games one after another (up to 50 instances in turn, for a time budget). On
                 cuda, each also with the step replayed as a CUDA graph (``cuda_graph``).
  (b) training   end-to-end agent steps/s of ``rlherd train ppo --runtime device`` (A2C, the
                 WarpDrive preset) on both games (on cuda, with and without ``cuda_graph``).
  (c) sampler    actions/s of rlherd's inverse-CDF sampler against
                 ``torch.distributions.Categorical(logits=...).sample()`` on ``[E, N, 5]``.

Observations are partial (6 features on the grid, the 2 nearest others on the continuous game)
so the 1000-agent grid fits in memory. Prints one JSON line per figure.
Usage: python benchmarks/device_tag_throughput.py [--device cpu] [--seconds 1.5]
       [--measures env_step training sampler]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

import rlherd
from rlherd.envs.device import make_device, sample_categorical
from rlherd.run.provenance import machine

# agents -> environment options
GRID = {5: dict(num_taggers=4), 105: dict(num_taggers=104), 1000: dict(num_taggers=999)}
CONTINUOUS = {5: dict(num_taggers=1, num_runners=4), 105: dict(num_taggers=5, num_runners=100)}
GAMES = (1, 100, 1000, 2000)
MEASURES = ("env_step", "training", "sampler")




def emit(device: str, **row) -> None:
    print(json.dumps(dict(bench="device_tag_throughput", device=device, **row,
                          machine=machine())), flush=True)  # fmt: skip


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def device_steps(
    env_id: str, games: int, options: dict, device: str, seconds: float, cuda_graph: bool = False
) -> float:
    """Environment steps/s (games x steps) of the device version, random actions drawn on
    the device."""
    env = make_device(env_id, games, device, seed=0, cuda_graph=cuda_graph, **options)
    env.reset()
    g = torch.Generator(env.device).manual_seed(0)
    shape = env.action_shape
    high = torch.as_tensor(env.action_nvec, device=env.device)
    for _ in range(3):  # warm up (allocator, kernels)
        env.step((torch.rand(shape, generator=g, device=env.device) * high).long())
    sync(device)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            env.step((torch.rand(shape, generator=g, device=env.device) * high).long())
        sync(device)
        steps += 10
    return steps * games / (time.perf_counter() - start)


def reference_steps(env_id: str, games: int, options: dict, seconds: float) -> float:
    """Game steps/s of the numpy reference stepping ``games`` games one after another."""
    refs = [rlherd.make(env_id, **options) for _ in range(min(games, 50))]  # round-robin
    for i, r in enumerate(refs):
        r.reset(seed=i)
    names = refs[0].possible_agents
    space = refs[0].action_space(names[0])
    space.seed(0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        r = refs[steps % len(refs)]
        if not r.agents:
            r.reset()
        r.step({a: space.sample() for a in names})
        steps += 1
    return steps / (time.perf_counter() - start)


def training(
    env_id: str, device: str, options: dict, num_envs: int, total: int, cuda_graph: bool
) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        run = rlherd.train("ppo", env_id, runtime="device", total_steps=total, run_dir=tmp,
                           progress=False, device=device, num_envs=num_envs,
                           unroll_length=20, env_kwargs=options, cuda_graph=cuda_graph)  # fmt: skip
    return run.summary["sps"]


def sampler(device: str, games: int, agents: int, seconds: float) -> dict:
    logits = torch.randn(games, agents, 5, device=device)
    g = torch.Generator(device).manual_seed(0)
    out = {}
    for name, fn in (
        ("rlherd_inverse_cdf", lambda: sample_categorical(logits, g)),
        ("torch_categorical", lambda: torch.distributions.Categorical(logits=logits).sample()),
    ):
        fn()
        sync(device)
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(10):
                fn()
            sync(device)
            n += 10
        out[name] = n * games * agents / (time.perf_counter() - start)
    return out


def env_step_rows(d: str, t: float, graphs: tuple[bool, ...]) -> None:
    for env_id, configs, extra in (
        ("tag-gridworld", GRID, dict(use_full_observation=False)),
        ("tag-continuous", CONTINUOUS, dict(use_full_observation=False)),
    ):
        for agents, options in configs.items():
            options = dict(options, **extra)
            for games in GAMES:
                ref = reference_steps(env_id, games, options, t)
                for graph in graphs:
                    dev = device_steps(env_id, games, options, d, t, graph)
                    emit(d, measure="env_step", env=env_id, games=games, agents=agents,
                         cuda_graph=graph, env_steps_per_s=round(dev, 1),
                         agent_steps_per_s=round(dev * agents, 1),
                         reference_env_steps_per_s=round(ref, 1),
                         speedup_vs_reference=round(dev / ref, 1))  # fmt: skip


def training_rows(d: str, graphs: tuple[bool, ...]) -> None:
    for env_id, options, games in (
        ("tag-gridworld", dict(num_taggers=4, use_full_observation=False), 2000),
        ("tag-continuous", dict(num_taggers=1, num_runners=4, use_full_observation=False), 2000),
    ):
        # A first run loads the kernels (CUDA loads each at its first launch), which would
        # otherwise fall on the setting measured first.
        training(env_id, d, options, games, 5 * games * 20 * 2, False)
        total = 5 * games * 20 * 12  # a dozen iterations of 20 steps
        for graph in graphs:
            sps = training(env_id, d, options, games, total, graph)
            emit(d, measure="training", env=env_id, games=games, agents=5, cuda_graph=graph,
                 agent_steps_per_s=sps, env_steps_per_s=round(sps / 5, 1))  # fmt: skip


def sampler_rows(d: str, t: float) -> None:
    for games, agents in ((2000, 5), (2000, 105)):
        rates = sampler(d, games, agents, t)
        speedup = rates["rlherd_inverse_cdf"] / rates["torch_categorical"]
        emit(d, measure="sampler", games=games, agents=agents, actions=5,
             **{f"{k}_actions_per_s": round(v, 1) for k, v in rates.items()},
             speedup=round(speedup, 2))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seconds", type=float, default=1.5, help="per measurement")
    parser.add_argument("--measures", nargs="+", default=list(MEASURES), choices=MEASURES)
    args = parser.parse_args()
    d, t = args.device, args.seconds
    graphs = (False, True) if d.startswith("cuda") else (False,)
    if "env_step" in args.measures:
        env_step_rows(d, t, graphs)
    if "training" in args.measures:
        training_rows(d, graphs)
    if "sampler" in args.measures:
        sampler_rows(d, t)


if __name__ == "__main__":
    main()
