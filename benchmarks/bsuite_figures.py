"""The Acme paper's bsuite experiments (section 4.7, Figure 10; section 4.8, Figure 11), as
``rlherd bsuite`` sweeps scored by bsuite's own analysis (``rlherd bsuite-report``).

- ``--figure 10``: DQN, R2D2, IMPALA, MCTS (with its perfect simulator) and PPO on the documented
  subset (``--ids subset``: 5 ids of each experiment, from easiest to hardest; see
  docs/guides/bsuite.md), each agent's ``bsuite`` preset, bsuite's episode budgets. The claims
  checked: R2D2 above DQN on memory (``memory_len``, ``memory_size``), and MCTS at the top on
  exploration (``deep_sea``).
- ``--figure 11``: DQN, DQfD, R2D2 and R2D3 on the subset's ``deep_sea`` and
  ``deep_sea_stochastic`` ids, DQfD and R2D3 with the paper's demonstrations. The claim: DQfD
  and R2D3 solve ids that DQN and R2D2 do not.

``--until-solved`` stops each deep sea id once bsuite's analysis counts it solved (its score is
then what the whole budget gives; ``rlherd bsuite --until-solved``), which spares most of the
episodes of the agents that solve them.

Sweeps stay in ``--out/<figure>/<agent>``: running the same command again keeps finished ids and
continues stopped ones, so the hours a figure takes can go in pieces. The mnist experiments need
MNIST in /tmp/mnist (bsuite downloads it on first use); ``--skip mnist mnist_noise mnist_scale``
leaves them out where it cannot.

``--kept DIR`` keeps what the report reads of each finished id (its config, summary and bsuite
CSV: a few kilobytes, no checkpoints) in ``DIR/<figure>/<agent>`` (``rlherd bsuite --kept``),
and starts each sweep from what is kept there, so the pieces can run on different machines and
fresh clones; benchmarks/results/bsuite holds the figures' finished ids so far, and ``rlherd
bsuite-report benchmarks/results/bsuite/figure10/*`` scores them.

Prints one JSON line per agent (ids finished, wall time of this invocation's sweep, machine),
one per experiment and agent (bsuite's score), one per claim (whether it holds), and writes the
report (radar, bars, scores) to ``--out/<figure>/report``.
Usage: python benchmarks/bsuite_figures.py --figure 10 [--agents dqn r2d2 ...] [--jobs 2]
       [--out runs/bsuite] [--kept DIR] [--skip EXPERIMENT ...] [--until-solved]
       [--total-episodes N (a smoke test)]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from rlherd.commands import bsuite as sweeps
from rlherd.errors import ConfigError
from rlherd.run.provenance import machine

AGENTS = {"10": ["dqn", "r2d2", "impala", "mcts", "ppo"], "11": ["dqn", "dqfd", "r2d2", "r2d3"]}
EXPERIMENTS = {"10": None, "11": ["deep_sea", "deep_sea_stochastic"]}
MEMORY = ("memory_len", "memory_size")


def finished_ids(folder: Path, ids: list[str]) -> list[str]:
    """The ``ids`` whose runs in ``folder`` finished (played their budget, or stopped solved)."""
    names = {csv.parent.parent.name for csv in sweeps.finished_csvs(folder)}
    return [i for i in ids if sweeps.run_path(folder, i).name in names]


def claims(figure: str, table) -> list[dict]:
    """The paper's qualitative claims, each with whether bsuite's scores (``table``: experiments
    by agents) bear it out. An agent without an experiment's scores (NaN in ``table``: not run)
    takes no part in that experiment's claims, and a claim with nobody to compare against is
    not judged."""
    out = []
    for experiment in table.index:
        row = table.loc[experiment].dropna()
        if figure == "10" and experiment in MEMORY and {"dqn", "r2d2"} <= set(row.index):
            out.append(dict(claim=f"r2d2 above dqn on {experiment}",
                            holds=bool(row["r2d2"] > row["dqn"]), r2d2=row["r2d2"],
                            dqn=row["dqn"]))  # fmt: skip
        if figure == "10" and experiment == "deep_sea" and "mcts" in row and len(row) > 1:
            top = bool(row["mcts"] >= row.max())
            out.append(dict(claim="mcts at the top on deep_sea", holds=top, scores=row.to_dict()))
        if figure == "11" and experiment in EXPERIMENTS["11"] and {"dqn", "r2d2"} & set(row.index):
            without = max(row.get("dqn", -math.inf), row.get("r2d2", -math.inf))
            for agent in ("dqfd", "r2d3"):
                if agent in row:
                    out.append(dict(claim=f"{agent} solves {experiment} ids dqn and r2d2 do not",
                                    holds=bool(row[agent] > without), scores=row.to_dict()))
    return out


def scores(row) -> dict:
    """A row of scores for a JSON line: a score bsuite has not given (an agent that did not run
    the experiment) is null, as NaN is not JSON."""
    return {k: None if math.isnan(v) else round(float(v), 3) for k, v in row.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--figure", choices=list(AGENTS), required=True)
    parser.add_argument("--agents", nargs="+", help="default: the figure's")
    parser.add_argument("--jobs", type=int, help="runs at once (default: as the cores hold)")
    parser.add_argument("--out", default="runs/bsuite")
    parser.add_argument("--kept", type=Path, metavar="DIR",
                        help="keep finished ids here, and start from those kept")
    parser.add_argument("--skip", nargs="+", default=[], metavar="EXPERIMENT")
    parser.add_argument("--total-episodes", type=int, help="per id: a smoke test, not a figure")
    parser.add_argument("--until-solved", action="store_true",
                        help="stop deep sea ids once solved (the scores are the same)")
    args = parser.parse_args()
    pool = sweeps.select(EXPERIMENTS[args.figure], ["subset"])
    ids = [i for i in pool if i.split("/")[1] not in args.skip]
    out = Path(args.out) / f"figure{args.figure}"
    extra = {} if args.total_episodes is None else {"total_episodes": args.total_episodes}
    for agent in args.agents or AGENTS[args.figure]:
        start = time.perf_counter()
        kept = None if args.kept is None else args.kept / f"figure{args.figure}" / agent
        try:
            result, done = sweeps.sweep(agent, ids, out / agent, args.jobs, progress=False,
                                        until_solved=args.until_solved, kept=kept, **extra)
        except ConfigError as e:  # e.g. a kept folder of other settings: one line, as rlherd's
            raise SystemExit(f"bsuite_figures: {e}") from None
        print(json.dumps(dict(bench="bsuite", figure=args.figure, agent=agent, ids=len(ids),
                              finished_before=len(done),
                              finished_now=len(finished_ids(out / agent, ids)) - len(done),
                              failed=result.failed, wall_time_s=round(time.perf_counter() - start),
                              machine=machine())), flush=True)  # fmt: skip
        if result.stopped:
            raise SystemExit(f"stopped; the same command continues the sweep in {out / agent}")
    dirs = [out / a for a in args.agents or AGENTS[args.figure]]
    scored = sweeps.report(dirs, out / "report")
    table = scored.experiments
    for experiment, row in table.iterrows():
        print(json.dumps(dict(bench="bsuite", figure=args.figure, experiment=experiment,
                              **scores(row))))  # fmt: skip
    for category, row in scored.categories.iterrows():  # with how many experiments each has
        print(json.dumps(dict(bench="bsuite", figure=args.figure, category=category,
                              **scores(row))))  # fmt: skip
    for claim in claims(args.figure, table):
        print(json.dumps(dict(bench="bsuite", figure=args.figure, **claim), default=float))


if __name__ == "__main__":
    main()
