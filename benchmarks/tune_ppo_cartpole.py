"""Does ``rlherd tune`` find a PPO config for CartPole-v1 that reaches 500 in fewer steps than
the shipped preset (``classic``, RL Zoo's tuned CartPole settings)?

1. ``rlherd tune ppo --env CartPole-v1 --trials 20 --jobs 2`` (RL Zoo's PPO space, trials of the
   preset's 100k steps on seed 0, value = area under the evaluation curve) in ``OUT/study``. A
   study already there is continued up to ``--trials`` trials, not started again.
2. The best config (``OUT/study/best.yaml``) and the preset each train on ``--seeds`` (1, 2, 3:
   seeds the study never trained on), evaluated every ``--eval-every`` steps for
   ``--eval-episodes`` greedy episodes, for ``--max-steps`` (default: the trials' length, so
   that the learning-rate and clip annealing run on the schedule the study judged). A run
   stops at its first evaluation with a mean of 500 (``StopAtReturn``); its steps then are the
   figure.

Prints one JSON line per run (figure ``steps_to_500``, unit agent steps, null where the run did
not reach 500 within ``--max-steps``) and one comparing the two: the mean over seeds, a run
that never reached 500 counted as ``--max-steps`` (so the mean is a lower bound), and the
verdict: "tuned" only where every tuned run reached 500 and its mean is below the preset's;
otherwise the line says that tuning could not beat the preset, and why.

Usage: python benchmarks/tune_ppo_cartpole.py [--trials 20] [--jobs 2] [--seeds 1 2 3]
       [--out runs/tune_ppo_cartpole]
Quick check of the script (minutes): --trials 2 --tune-steps 2000 --tune-eval-every 1000
       --seeds 1 --max-steps 2000 --eval-every 1000 --eval-episodes 2
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path
from statistics import mean
from typing import Any

import rlherd
from rlherd.config import read_config_file
from rlherd.run.callbacks import StopAtReturn
from rlherd.run.provenance import machine

ENV, GOAL = "CartPole-v1", 500.0
MACHINE = machine()


def tune(args: argparse.Namespace, study: Path) -> None:
    """The trials still missing from the study in ``study``, by the command itself."""
    table = study / "trials.csv"
    done = 0
    if table.exists():
        with open(table, newline="") as f:
            done = len(list(csv.DictReader(f)))
    if done >= args.trials:
        return
    command = [sys.executable, "-m", "rlherd.cli", "tune", "ppo", "--env", ENV,
               "--trials", str(args.trials - done), "--jobs", str(args.jobs),
               "--out", str(study)]  # fmt: skip
    for flag, value in (("--total-steps", args.tune_steps), ("--eval-every", args.tune_eval_every)):
        if value is not None:
            command += [flag, str(value)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def steps_to_goal(name: str, seed: int, args: argparse.Namespace, out: Path,
                  **config: Any) -> dict[str, Any]:  # fmt: skip
    """Train ``config`` (a preset, or a best.yaml's fields) on ``seed`` until an evaluation
    reaches the goal or ``--max-steps`` pass."""
    run = rlherd.train("ppo", ENV, seed=seed, total_steps=args.max_steps,
                       run_dir=out / f"{name}-seed{seed}", overwrite=True, progress=False,
                       eval_every=args.eval_every, eval_episodes=args.eval_episodes,
                       callbacks=[StopAtReturn(GOAL)], **config)  # fmt: skip
    if run.stopped:
        sys.exit("interrupted; the same command continues the study (the runs start again)")
    reached = "stopped_by" in run.summary
    return dict(bench="tune_ppo_cartpole", figure="steps_to_500", unit="agent steps",
                config=name, env=ENV, seed=seed, value=run.steps if reached else None,
                max_steps=args.max_steps, eval_every=args.eval_every,
                eval_episodes=args.eval_episodes, wall_time_s=run.summary["wall_time_s"],
                run_dir=str(run.path), machine=MACHINE)  # fmt: skip


def compare(tuned: list[dict], preset: list[dict], args: argparse.Namespace,
            best: dict) -> dict[str, Any]:  # fmt: skip
    """Means over seeds (a run that never reached the goal counts as the budget) and the
    verdict."""
    def steps(rows: list[dict]) -> float:
        return mean(r["value"] if r["value"] is not None else args.max_steps for r in rows)

    reached = {name: sum(r["value"] is not None for r in rows)
               for name, rows in (("tuned", tuned), ("preset", preset))}  # fmt: skip
    tuned_mean, preset_mean = steps(tuned), steps(preset)
    if reached["tuned"] < len(tuned):
        verdict = (f"could not: the tuned config missed 500 within {args.max_steps} steps on "
                   f"{len(tuned) - reached['tuned']} of {len(tuned)} seeds")
    elif tuned_mean >= preset_mean:
        verdict = "could not: the tuned config took as many steps as the preset or more"
    else:
        verdict = "tuned"
    return dict(bench="tune_ppo_cartpole", figure="tuned_vs_preset_steps_to_500",
                unit="agent steps (mean over seeds)", tuned=tuned_mean, preset=preset_mean,
                ratio=round(tuned_mean / preset_mean, 3), reached=reached,
                seeds=args.seeds, trials=args.trials, verdict=verdict,
                best_config=best["config"], machine=MACHINE)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tune-steps", type=int, help="steps per trial (default: 100k)")
    parser.add_argument("--tune-eval-every", type=int, help="(default: a tenth of a trial)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--max-steps", type=int, help="(default: the trials' length)")
    parser.add_argument("--eval-every", type=int, default=2_000)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("runs/tune_ppo_cartpole"))
    args = parser.parse_args()
    study = args.out / "study"
    tune(args, study)
    if not (study / "best.yaml").exists():
        sys.exit(f"no trial of {study} completed: no best config to compare")
    best = read_config_file(study / "best.yaml")
    args.max_steps = args.max_steps or best["total_steps"]
    runs = args.out / "runs"
    rows: dict[str, list[dict]] = {"tuned": [], "preset": []}
    for seed in args.seeds:
        for name, config in (("tuned", dict(preset=best["preset"], **best["config"],
                                            **best["settings"])),
                             ("preset", {})):  # fmt: skip
            rows[name].append(steps_to_goal(name, seed, args, runs, **config))
            print(json.dumps(rows[name][-1]), flush=True)
    print(json.dumps(compare(rows["tuned"], rows["preset"], args, best)), flush=True)


if __name__ == "__main__":
    main()
