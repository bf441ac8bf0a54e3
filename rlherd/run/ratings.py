"""Elo ratings from the games a self-play run's evaluations played.

``rlherd eval RUN --opponent ...`` on a turn-based game appends every game it plays to the run's
``metrics/games.csv`` (who played whom, in which seat, and the outcome for the first named) and
rewrites ``ratings.csv``: each player's Elo rating, fitted to all of those games at once
(Bradley-Terry by Hunter's MM algorithm, draws counting half a win, as Elo's expected score
does), so the table does not depend on the order the games were played in. Players are the
run's policy at a step (``step:<K>``: the latest checkpoint's, or a snapshot's), ``random`` and
OpenSpiel's MCTS bot (``mcts:<N>``). Ratings are anchored at ``random`` = 0 where it played,
else at a mean of 0.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

from rlherd.run.rundir import RunDir, open_to_write

GAMES_FIELDS = ["player", "opponent", "seat", "outcome"]
PRIOR_DRAWS = 0.5  # a virtual half draw between every pair that met: a player that won every
# game keeps a finite rating


def elo(games: list[tuple[str, str, float]], iterations: int = 500) -> dict[str, float]:
    """Ratings from ``(player, opponent, outcome)`` games, outcome 1 (the player won), 0.5
    (a draw) or 0.

    >>> ratings = elo([("a", "b", 1.0)] * 3 + [("a", "b", 0.0)])
    >>> round(ratings["a"] - ratings["b"])  # 3 wins in 4 (plus the prior's draw)
    166
    """
    score: dict[str, float] = defaultdict(float)
    meetings: dict[tuple[str, str], float] = defaultdict(float)
    for player, opponent, outcome in games:
        score[player] += outcome
        score[opponent] += 1.0 - outcome
        meetings[min(player, opponent), max(player, opponent)] += 1.0
    for a, b in list(meetings):
        meetings[a, b] += PRIOR_DRAWS
        score[a] += PRIOR_DRAWS / 2
        score[b] += PRIOR_DRAWS / 2
    players = sorted(score)
    strength = dict.fromkeys(players, 1.0)
    for _ in range(iterations):
        for p in players:
            denominator = sum(n / (strength[a] + strength[b]) for (a, b), n in meetings.items()
                              if p in (a, b))  # fmt: skip
            strength[p] = score[p] / denominator
        norm = math.exp(sum(math.log(v) for v in strength.values()) / len(players))
        strength = {p: v / norm for p, v in strength.items()}
    ratings = {p: 400.0 * math.log10(v) for p, v in strength.items()}
    anchor = ratings.get("random", 0.0)
    return {p: r - anchor for p, r in ratings.items()}


def record_games(run_dir: Path, games: list[tuple[str, str, int, float]]) -> dict[str, float]:
    """Append ``(player, opponent, seat, outcome)`` games to ``metrics/games.csv``, rewrite
    ``ratings.csv`` from all of them, and return the ratings."""
    RunDir(run_dir).check_links()  # a link in the run would have eval write through it
    path = run_dir / "metrics" / "games.csv"
    path.parent.mkdir(exist_ok=True)
    with open_to_write(path, append=True, root=run_dir) as f:  # never through a link
        writer = csv.writer(f)
        if f.tell() == 0:
            writer.writerow(GAMES_FIELDS)
        writer.writerows(games)
    with open(path, newline="") as f:
        every = [(r["player"], r["opponent"], float(r["outcome"])) for r in csv.DictReader(f)]
    ratings = elo(every)
    played: dict[str, int] = defaultdict(int)
    for player, opponent, _ in every:
        played[player] += 1
        played[opponent] += 1
    with open_to_write(run_dir / "ratings.csv", root=run_dir) as f:
        writer = csv.writer(f)
        writer.writerow(["player", "elo", "games"])
        for player, rating in sorted(ratings.items(), key=lambda kv: -kv[1]):
            writer.writerow([player, round(rating, 1), played[player]])
    return ratings
