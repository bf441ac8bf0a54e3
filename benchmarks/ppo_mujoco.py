"""PPO and BatchPPO on MuJoCo (HalfCheetah-v5, Hopper-v5). Not a test: prints, per run, the
final training return, the mean-action (deterministic) evaluation return and the wall time, next
to the published PPO figures at 1M steps.

Presets: ``cleanrl`` (CleanRL's ppo_continuous_action defaults; what ``rlherd train ppo`` picks
for Hopper), ``tuned`` (RL Zoo's tuned settings: the ``halfcheetah`` preset, picked for
HalfCheetah, and ``hopper``) and ``batchppo`` (the TensorFlow Agents paper's configuration).

Usage: python benchmarks/ppo_mujoco.py [--steps 1000000] [--envs HalfCheetah-v5,Hopper-v5]
       [--presets tuned,batchppo,cleanrl] [--seed 0]
Each run is its own process-free ``rlherd.train`` call; on 2 cores a tuned 1M-step run takes
about half an hour, so run environments in separate invocations to use both cores.
"""

from __future__ import annotations

import argparse
import json
import tempfile

import rlherd
from rlherd.commands.evaluate import evaluate
from rlherd.run.provenance import machine

# Final returns at 1M steps as published (approximate; read off their reports).
PUBLISHED = {
    ("HalfCheetah-v5", "cleanrl"): 1440,  # CleanRL ppo_continuous_action benchmark
    ("Hopper-v5", "cleanrl"): 2380,
    ("HalfCheetah-v5", "tuned"): 5800,  # RL Zoo PPO, tuned hyperparameters
    ("Hopper-v5", "tuned"): 2400,
}


def preset_name(env: str, preset: str) -> str:
    return env.split("-")[0].lower() if preset == "tuned" else preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--envs", default="HalfCheetah-v5,Hopper-v5")
    parser.add_argument("--presets", default="tuned,batchppo,cleanrl")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-episodes", type=int, default=10)
    args = parser.parse_args()
    ran_on = machine()
    for env in args.envs.split(","):
        for preset in args.presets.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                run = rlherd.train(
                    "ppo",
                    env,
                    preset=preset_name(env, preset),
                    total_steps=args.steps,
                    seed=args.seed,
                    run_dir=tmp,
                    progress=False,
                )
                greedy = evaluate(tmp, episodes=args.eval_episodes)
            s = run.summary
            print(json.dumps(dict(
                bench="ppo_mujoco", env=env, preset=preset, seed=args.seed,
                steps=s["actor_steps"], updates=s["learner_steps"], episodes=s["episodes"],
                final_return_mean=round(s["final_return_mean"], 1),
                mean_action_return=round(greedy["eval_return_mean"], 1),
                published_return_1m=PUBLISHED.get((env, preset)),
                wall_time_s=s["wall_time_s"], sps=s["sps"], machine=ran_on,
            )), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
