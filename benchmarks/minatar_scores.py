"""MinAtar scores: IMPALA, PPO and DQN with their shipped ``minatar`` presets, next to the
published figures. (DQN's is Dopamine's MinAtar DQN, one update per 4 frames; the MinAtar
paper's DQN, whose figures stand beside it, is ``minatar_paper``, one update per frame.)

For each game, agent and seed: one ``rlherd train`` run of ``--steps`` agent steps (frames; MinAtar
has no frame skip) on the single runtime, then ``--eval-episodes`` greedy episodes. Prints one JSON
line per run (final training return over the last 100 episodes, greedy return, wall time,
steps/s, the published figure), then a Markdown table of the means over seeds. The run
directories stay in ``--out`` so that ``--plot`` (or ``rlherd plot``) can draw their curves; a
finished run already there is evaluated again, not retrained (delete it to retrain), and a stopped
one continues from its last checkpoint.

Published figures, read off their learning curves (training returns at 5M frames unless said
otherwise): the MinAtar paper (Young & Tian 2019, its learning curves over 30 seeds) has DQN at
about 10 on Breakout and 50 on Freeway, and its online actor-critic AC(lambda) at about 17.5 and
47; gymnax-blines' PPO (a sampled-action evaluation, on gymnax's MinAtar without sticky actions)
about 22-26 on Breakout and 52 on Freeway at 4.8M. The issue "Scores that match the literature"
asks for 20 on Breakout from IMPALA and PPO, 10 from DQN, and 50 on Freeway from PPO and DQN.

Usage: python benchmarks/minatar_scores.py [--steps 5000000] [--agents impala ppo dqn]
       [--games Breakout Freeway] [--seeds 0 1 2] [--out runs/minatar_scores] [--plot DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from rlherd.commands.evaluate import evaluate
from rlherd.commands.plot import load_curves, plot_runs
from rlherd.commands.train import train_to
from rlherd.run.provenance import machine

# (agent, game) -> (published figure, its source): the nearest published algorithm's.
PUBLISHED = {
    ("dqn", "Breakout"): (10, "MinAtar paper, DQN"),
    ("dqn", "Freeway"): (50, "MinAtar paper, DQN"),
    ("impala", "Breakout"): (17.5, "MinAtar paper, AC(lambda)"),
    ("impala", "Freeway"): (47, "MinAtar paper, AC(lambda)"),
    ("ppo", "Breakout"): (26, "gymnax-blines PPO, sampled actions"),
    ("ppo", "Freeway"): (52, "gymnax-blines PPO, sampled actions"),
}


MACHINE = machine()


def last_returns_mean(run_dir: Path, episodes: int = 100) -> float | None:
    """Mean training return of the run's last ``episodes`` episodes (summary.json keeps 20)."""
    _, curves = load_curves(run_dir)
    returns = curves[""]
    return float(np.mean(returns[-episodes:])) if len(returns) else None


def score(agent: str, game: str, steps: int, seed: int, out: Path, eval_episodes: int) -> dict:
    """Train one run (or continue or reuse the one ``out`` holds) and evaluate it."""
    run_dir = out / f"{agent}-{game}-seed{seed}"
    summary_path = run_dir / "summary.json"
    if train_to(agent, f"MinAtar/{game}-v1", run_dir, steps, seed, progress=False).stopped:
        sys.exit(f"stopped; the same command continues {run_dir}")
    greedy = evaluate(run_dir, episodes=eval_episodes)
    summary = json.loads(summary_path.read_text())
    published, source = PUBLISHED.get((agent, game), (None, ""))
    return dict(bench="minatar_scores", agent=agent, game=game, steps=summary["actor_steps"],
                seed=seed, final_return_100=last_returns_mean(run_dir),
                greedy_return=greedy["eval_return_mean"], wall_time_s=summary["wall_time_s"],
                sps=summary["sps"], published=published, published_source=source,
                run_dir=str(run_dir), machine=MACHINE)  # fmt: skip


def table(rows: list[dict]) -> str:
    """Means over seeds, one line per (agent, game)."""
    lines = [
        "| agent | game | steps | seeds | final training return (last 100) | greedy return "
        "| wall time | steps/s | published |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["agent"], row["game"]), []).append(row)
    for (agent, game), runs in groups.items():
        mean = {k: float(np.mean([r[k] for r in runs]))
                for k in ("final_return_100", "greedy_return", "wall_time_s", "sps")}  # fmt: skip
        seeds = ",".join(str(r["seed"]) for r in runs)
        finals = " / ".join(f"{r['final_return_100']:.1f}" for r in runs)
        published = runs[0]["published"]
        published = "—" if published is None else f"{published} ({runs[0]['published_source']})"
        lines.append(
            f"| {agent} | {game} | {runs[0]['steps']:,} | {seeds} | "
            f"{mean['final_return_100']:.1f} ({finals}) | {mean['greedy_return']:.1f} | "
            f"{mean['wall_time_s'] / 60:.1f} min | {mean['sps']:,.0f} | {published} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=5_000_000, help="agent steps (frames) per run")
    parser.add_argument("--agents", nargs="+", default=["impala", "ppo", "dqn"])
    parser.add_argument("--games", nargs="+", default=["Breakout", "Freeway"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--out", default="runs/minatar_scores", help="where the runs are kept")
    parser.add_argument("--plot", help="directory for one learning-curve figure per game")
    args = parser.parse_args()
    out = Path(args.out)
    rows = []
    for game in args.games:
        for agent in args.agents:
            for seed in args.seeds:
                rows.append(score(agent, game, args.steps, seed, out, args.eval_episodes))
                print(json.dumps(rows[-1]), flush=True)
        if args.plot:
            Path(args.plot).mkdir(parents=True, exist_ok=True)
            runs = [r["run_dir"] for r in rows if r["game"] == game]
            plot_runs(runs, Path(args.plot) / f"minatar_{game.lower()}.png", window=100,
                      title=f"MinAtar/{game}-v1, {args.steps:,} steps")  # fmt: skip
    print(table(rows))


if __name__ == "__main__":
    main()
