"""PettingZoo's games on the host runtimes:

- ``spread-<runtime>``: PPO on MPE's ``simple_spread_v3`` (3 agents, ``local_ratio`` 0.5, 25
  steps a game, discrete actions: the game's defaults), one policy shared by the agents, 1M
  environment steps, on ``single``, ``mono`` and ``distributed``. Goal: a mean per-agent
  episode return of -20; a uniformly random policy gets about -26 (measured here,
  ``--random``).
- ``kaz-mono``: PPO on ``knights_archers_zombies_v11`` (vector observations; knights and
  archers die mid-game), a policy for the archers and one for the knights, 500k environment
  steps on ``mono``: each policy's training return by blocks of 100k steps, its greedy return
  over 100 games, and a uniformly random policy's over the same 100 games.
- ``connect-four-<runtime>``: PPO self-play on ``connect_four_v3``, 300k steps: win, draw and
  loss rates of the greedy policy against random moves (200 games, both seats) and against
  OpenSpiel's MCTS bot with 100 simulations (100 games). Goal: 90% against random.

Each is one run of seed 1 (``--seeds`` for more) in ``--out``; a finished run there is reported
again, not retrained, and a stopped one continues. Prints one JSON line per run.

Usage: python benchmarks/many_agents.py [--figures spread kaz connect-four]
       [--runtimes single mono distributed] [--seeds 1] [--steps N] [--out runs/many_agents]
       [--random]
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

from rlherd.commands.evaluate import evaluate
from rlherd.commands.plot import load_curves
from rlherd.commands.train import train_to
from rlherd.run.provenance import machine

SPREAD = "pettingzoo/mpe2.simple_spread_v3"
GOAL = -20.0
KAZ = "pettingzoo/pettingzoo.butterfly.knights_archers_zombies_v11"
KAZ_POLICIES = "archer=archer_*,knight=knight_*"
CONNECT_FOUR = "pettingzoo/pettingzoo.classic.connect_four_v3"
MACHINE = machine()


def random_return(games: int = 200, seed: int = 0) -> float:
    """A uniformly random policy's mean per-agent return over ``games`` games."""
    from rlherd.envs.pettingzoo import AgentRows

    rows, rng, returns = AgentRows(SPREAD, 1), np.random.default_rng(seed), []
    for game in range(games):
        rows.reset(seed=seed + game)
        total, done = np.zeros(rows.num_envs), False
        while not done:
            _, reward, terminated, truncated, _ = rows.step(rng.integers(0, 5, rows.num_envs))
            total, done = total + reward, bool((terminated | truncated).all())
        returns += total.tolist()
    rows.close()
    return float(np.mean(returns))


def figure(runtime: str, seed: int, steps: int, out: Path) -> dict:
    run_dir = out / f"spread-{runtime}-seed{seed}"
    run = train_to("ppo", SPREAD, run_dir, steps, seed, progress=False, runtime=runtime)
    _, curves = load_curves(run_dir)
    greedy = evaluate(run_dir, episodes=100)["eval_return_mean"]
    last = float(np.mean(curves[""][-300:]))
    return dict(bench="many_agents", figure=f"spread-{runtime}", env=SPREAD, seed=seed,
                steps=run.summary["actor_steps"], final_return_300=last,
                greedy_return_100_games=greedy, goal=GOAL, reached=greedy >= GOAL,
                wall_time_s=run.summary["wall_time_s"], sps=run.summary["sps"],
                run_dir=str(run_dir), machine=MACHINE)  # fmt: skip


def random_policy_returns(env_id: str, games: int, seed: int) -> dict[str, float]:
    """Each policy's mean return (``KAZ_POLICIES``) of uniformly random moves over ``games``."""
    from rlherd.envs.pettingzoo import AgentRows, assign_policies

    rows, rng = AgentRows(env_id, 1), np.random.default_rng(seed)
    names = np.array(assign_policies(rows.possible_agents, KAZ_POLICIES))
    returns = []
    for game in range(games):
        rows.reset(seed=seed + game)
        total, done = np.zeros(rows.num_envs), np.zeros(rows.num_envs, dtype=bool)
        while not (done | rows.absent).all():
            playing = ~(done | rows.absent)
            moves = rng.integers(0, rows.single_action_space.n, rows.num_envs)
            _, reward, terminated, truncated, _ = rows.step(moves)
            total += reward * playing
            done |= (terminated | truncated) & playing
        returns.append(total)
    rows.close()
    table = np.array(returns)
    return {name: float(table[:, names == name].mean()) for name in dict.fromkeys(names)}


def kaz(seed: int, steps: int, out: Path) -> dict:
    run_dir = out / f"kaz-mono-seed{seed}"
    run = train_to("ppo", KAZ, run_dir, steps, seed, progress=False, runtime="mono",
                   settings=dict(policies=KAZ_POLICIES))  # fmt: skip
    blocks = {}
    with open(run_dir / "metrics" / "train.csv") as f:
        rows = list(csv.DictReader(f))
    for name in ("archer", "knight"):
        column = [(int(r["actor_steps"]), float(r[f"episode_return_{name}"])) for r in rows
                  if r.get(f"episode_return_{name}")]  # fmt: skip
        blocks[name] = [round(float(np.mean([v for s, v in column if lo <= s < lo + 100_000])), 2)
                        for lo in range(0, steps, 100_000)]  # fmt: skip
    greedy = evaluate(run_dir, episodes=100)
    return dict(bench="many_agents", figure="kaz-mono", env=KAZ, seed=seed,
                steps=run.summary["actor_steps"], agent_steps=run.summary.get("agent_steps"),
                training_return_by_100k_steps=blocks,
                greedy_return_100_games={k[12:]: v for k, v in greedy.items()
                                         if k.startswith("eval_return_")},
                random_return_100_games=random_policy_returns(KAZ, 100, 1_000_000),
                wall_time_s=run.summary["wall_time_s"], sps=run.summary["sps"],
                run_dir=str(run_dir), machine=MACHINE)  # fmt: skip


def connect_four(runtime: str, seed: int, steps: int, out: Path) -> dict:
    run_dir = out / f"connect-four-{runtime}-seed{seed}"
    run = train_to("ppo", CONNECT_FOUR, run_dir, steps, seed, progress=False, runtime=runtime)
    random = evaluate(run_dir, episodes=200, opponent="random")
    mcts = evaluate(run_dir, episodes=100, opponent="mcts:100")
    keys = ("win_rate", "draw_rate", "loss_rate", "first_win_rate", "second_win_rate")
    return dict(bench="many_agents", figure=f"connect-four-{runtime}", env=CONNECT_FOUR,
                seed=seed, steps=run.summary["actor_steps"],
                vs_random_200_games={k: random[k] for k in keys},
                vs_mcts100_100_games={k: mcts[k] for k in keys},
                goal=0.9, reached=random["win_rate"] >= 0.9,
                wall_time_s=run.summary["wall_time_s"], sps=run.summary["sps"],
                run_dir=str(run_dir), machine=MACHINE)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--figures", nargs="+", default=["spread", "kaz", "connect-four"])
    parser.add_argument("--runtimes", nargs="+", default=["single", "mono", "distributed"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--steps", type=int, help="override each figure's steps")
    parser.add_argument("--out", default="runs/many_agents")
    parser.add_argument("--random", action="store_true", help="also the random policy's return")
    args = parser.parse_args()
    out = Path(args.out)
    if args.random:
        line = dict(bench="many_agents", figure="spread-random", env=SPREAD,
                    random_return_200_games=random_return(), machine=MACHINE)
        print(json.dumps(line), flush=True)
    for seed in args.seeds:
        if "spread" in args.figures:
            for runtime in args.runtimes:
                print(json.dumps(figure(runtime, seed, args.steps or 1_000_000, out)), flush=True)
        if "kaz" in args.figures:
            print(json.dumps(kaz(seed, args.steps or 500_000, out)), flush=True)
        if "connect-four" in args.figures:
            for runtime in args.runtimes:
                line = connect_four(runtime, seed, args.steps or 300_000, out)
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
