"""Two-player turn-based PettingZoo games (the AEC API: ``connect_four_v3``, ``tictactoe_v3``),
played by self-play: the learner takes one seat of every game, an opponent the other.

A :class:`TurnGames` vector environment has one row per game. A step is the learner's move and,
unless that ended the game, the opponent's reply, so a row's transition runs from one of the
learner's turns to its next: its reward is everything the learner earned in between (a loss
arrives with the opponent's winning move), and PettingZoo's per-agent action mask
(``obs["action_mask"]``) is the learner's at its turn. The learner plays each seat in turn
(game ``g``'s ``e``-th episode: seat ``(g + e) % 2``), so both seats are learned.

In training the opponent is drawn, for each game, from an :class:`OpponentPool` of the policy's
past selves: a snapshot of the acting policy every ``every`` steps (the ``opponent_every``
setting), at most ``size`` kept (``opponent_pool``); the newest plays with probability
``latest`` (``opponent_latest``), else one drawn uniformly. Until the first snapshot, and with no
policy bound (the environment loop binds the actor's), the opponent moves uniformly at random
among legal moves. Evaluation (``rlherd eval --opponent``) passes a fixed opponent instead.

``--total-steps`` counts steps of this environment (a move of the learner with the reply);
:attr:`TurnGames.moves` counts both players' moves (the run's ``agent_steps``).
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlherd.core import flatten_space, flatten_value
from rlherd.envs.pettingzoo import KNOWN_GAMES
from rlherd.envs.wrappers import FlatView, check_mask, one_finite_number
from rlherd.errors import ConfigError, UnsupportedEnv


def make_turn_game(module: Any, env_id: str, **kwargs: Any) -> Any:
    """The AEC game of ``module`` (its ``env(**kwargs)``)."""
    with warnings.catch_warnings():  # PettingZoo 1.27 prefers a registry it does not have yet
        warnings.filterwarnings("ignore", message="The old environment creation API")
        try:
            game = module.env(**kwargs)
        except TypeError as e:
            if kwargs:
                raise ConfigError(f"{env_id} does not take the options {kwargs}: {e}") from e
            raise
    if len(game.possible_agents) != 2:
        raise ConfigError(f"{env_id} is a turn-based game of {len(game.possible_agents)} "
                          "agents; rlherd plays turn-based games of two (self-play)")  # fmt: skip
    return game


class RandomMoves:
    """An opponent that moves uniformly at random among legal moves."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def draw(self) -> int:
        return 0

    def act(self, which: int, obs: dict[str, np.ndarray], histories: list) -> np.ndarray:
        legal = obs["action_mask"].astype(bool)
        return np.array([self.rng.choice(np.flatnonzero(row)) for row in legal])


class PolicyMoves:
    """An opponent that moves with a policy (a :class:`~rlherd.core.Policy`: a run's snapshot,
    or its latest parameters), sampling from its own generator."""

    def __init__(self, policy: Any, seed: int = 0):
        self.policy = policy
        self.generator = torch.Generator(getattr(policy, "device", "cpu")).manual_seed(seed)

    def draw(self) -> int:
        return 0

    def act(self, which: int, obs: dict[str, np.ndarray], histories: list) -> np.ndarray:
        return _policy_moves(self.policy, obs, self.generator)


def _policy_moves(policy: Any, obs: dict[str, np.ndarray], generator) -> np.ndarray:
    rows = len(obs["action_mask"])
    tensors = {k: torch.as_tensor(v) for k, v in obs.items()}
    with torch.no_grad():
        outputs, _ = policy(tensors, torch.ones(rows, dtype=torch.bool),
                            policy.initial_state(rows), generator)  # fmt: skip
    return outputs["action"].cpu().numpy()


class OpponentPool:
    """The learner's past selves (see the module docstring). ``bind(policy)`` hands it the
    policy that acts for the learner (its parameters are snapshot); ``step(n)`` counts steps."""

    def __init__(self, every: int, latest: float, size: int, seed: int = 0):
        self.every, self.latest, self.size = every, latest, size
        self.policy: Any = None
        self.snapshots: list[Any] = []  # policies with a past self's parameters, oldest first
        self.taken: list[int] = []  # the step each was taken at: its id
        self.retired: dict[int, Any] = {}  # dropped from the pool, still playing a game
        self.steps = 0
        self.seed(seed)

    def seed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.random = RandomMoves(seed)
        self._seed, self.generators = seed, {}  # one per device the snapshots act on

    def _generator(self, device: Any) -> torch.Generator:
        key = str(device)
        if key not in self.generators:
            self.generators[key] = torch.Generator(device).manual_seed(self._seed)
        return self.generators[key]

    def bind(self, policy: Any) -> None:
        self.policy = policy
        if not self.snapshots:
            self._snapshot()

    def step(self, n: int) -> None:
        self.steps += n
        if self.policy is not None and self.steps >= self.taken[-1] + self.every:
            self._snapshot()

    def _snapshot(self) -> None:
        """Keep the policy's parameters now; the oldest beyond ``size`` retires (it finishes
        the games it plays, and is drawn for no more)."""
        self.snapshots.append(copy.deepcopy(self.policy))
        self.taken.append(self.steps)
        if len(self.snapshots) > self.size:
            self.retired[self.taken.pop(0)] = self.snapshots.pop(0)

    def keep(self, playing: set[int]) -> None:
        """Forget the retired snapshots no game in ``playing`` (ids) still plays against."""
        self.retired = {k: v for k, v in self.retired.items() if k in playing}

    def draw(self) -> int:
        """Which snapshot plays a new game (its id: the step it was taken at): the newest with
        probability ``latest``, else one uniformly; -1 (random moves) while there is none."""
        if not self.snapshots:
            return -1
        if self.rng.random() < self.latest:
            return self.taken[-1]
        return self.taken[int(self.rng.integers(len(self.snapshots)))]

    def act(self, which: int, obs: dict[str, np.ndarray], histories: list) -> np.ndarray:
        if which in self.taken:
            policy = self.snapshots[self.taken.index(which)]
        elif which in self.retired:
            policy = self.retired[which]
        else:  # none yet
            return self.random.act(which, obs, histories)
        return _policy_moves(policy, obs, self._generator(getattr(policy, "device", "cpu")))

    def __getstate__(self) -> dict[str, Any]:
        # The bound policy is the actor's: the environment loop binds it again after a resume.
        return {**self.__dict__, "policy": None}


class SpielMoves:
    """OpenSpiel's MCTS bot (``mcts:N``: :class:`rlherd.envs.openspiel.MCTSOpponent`) on the
    OpenSpiel twin of the game, following the game's moves (PettingZoo's ``connect_four_v3``
    and OpenSpiel's ``connect_four`` number their moves alike: a column)."""

    TWINS = {"connect_four_v3": "connect_four"}

    def __init__(self, env_id: str, simulations: int, seed: int = 0):
        from rlherd.envs.openspiel import MCTSOpponent, _pyspiel

        name = env_id.rsplit(".", 1)[-1]
        if name not in self.TWINS:
            raise ConfigError(f"mcts:N plays {', '.join(self.TWINS)} (games with an OpenSpiel "
                              f"twin whose moves are numbered alike), not {env_id}")  # fmt: skip
        self.game = _pyspiel().load_game(self.TWINS[name])
        self.bot = MCTSOpponent(self.game, simulations, seed).bot

    def draw(self) -> int:
        return 0

    def act(self, which: int, obs: dict[str, np.ndarray], histories: list) -> np.ndarray:
        moves = []
        for history in histories:
            state = self.game.new_initial_state()
            for move in history:
                state.apply_action(move)
            moves.append(self.bot.step(state))
        return np.array(moves)


class TurnGames(gym.vector.VectorEnv):
    """``games`` two-player AEC games of ``env_id``, one row each: the learner's seat against
    ``opponents`` (an :class:`OpponentPool`, :class:`RandomMoves`, :class:`PolicyMoves` or
    :class:`SpielMoves`). With ``repeat=False`` (an evaluation) a game is played once: its row
    stays over."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, env_id: str, module: Any, games: int, opponents: Any,
                 repeat: bool = True, **kwargs: Any):  # fmt: skip
        self.env_id, self.opponents, self.repeat = env_id, opponents, repeat
        self.games = [make_turn_game(module, env_id, **kwargs) for _ in range(games)]
        self.possible_agents = list(self.games[0].possible_agents)
        raw = self.games[0].observation_space(self.possible_agents[0])
        if not isinstance(raw, gym.spaces.Dict) or "action_mask" not in raw.spaces:
            raise ConfigError(f"{env_id}'s observations hold no action_mask; rlherd "
                              "plays turn-based games whose observations say the legal moves")
        first = self.games[0]
        spaces = [(first.observation_space(a), first.action_space(a)) for a in self.possible_agents]
        if spaces[0] != spaces[1]:
            raise ConfigError(f"{env_id}'s two players observe or act in different spaces; "
                              "rlherd's self-play has one policy take both seats")  # fmt: skip
        self.raw_space = raw
        # A game of one's own is held to its space at every turn; PettingZoo's own are not.
        self._check = None if env_id.startswith(KNOWN_GAMES) else FlatView(raw, env_id)
        self._where = f"{env_id}'s observe()"
        self.single_observation_space, self.dropped = flatten_space(raw, f"{env_id}'s")
        self.single_action_space = self.games[0].action_space(self.possible_agents[0])
        self.num_envs = games
        self.agents_per_game = 1
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space,
                                                              games)  # fmt: skip
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, games)
        self.episodes = np.zeros(games, dtype=np.int64)  # each game's episodes begun
        self.seat = np.zeros(games, dtype=np.int64)  # the learner's seat in each game
        self.opponent = np.zeros(games, dtype=np.int64)  # who plays the other seat
        self.over = np.zeros(games, dtype=bool)
        self.outcome = np.zeros(games)  # the learner's return in each game's last episode
        self.history: list[list[int]] = [[] for _ in range(games)]  # each game's moves so far
        self.moves = 0  # both players' moves in the last step
        self._seed: int | None = None

    # ------------------------------------------------------------------ the learner's view
    def learner(self, g: int) -> str:
        return self.possible_agents[self.seat[g]]

    def _rows(self) -> Any:
        return self._views(list(range(self.num_envs)),
                           [self.learner(g) for g in range(self.num_envs)])  # fmt: skip

    def _views(self, games: list[int], agents: list[str]) -> Any:
        """What ``agents`` see of ``games``, flattened, as one batch. A game of one's own's
        views are held to its space (the learner's and the opponent's alike: both are the
        policy's), checked as a batch, and each view again only to name the one at fault."""
        raw = [self.games[g].observe(a) for g, a in zip(games, agents, strict=True)]
        if self._check is None:
            return self._batch([flatten_value(self.raw_space, o) for o in raw])
        views = [self._check.flat(o, self._where, f" for {a}")
                 for o, a in zip(raw, agents, strict=True)]  # fmt: skip
        try:
            batch = self._batch(views)
        except ValueError:  # a view of another shape: named below
            self._name_the_fault(views, games, agents)
            raise
        if not self._fine(batch, self.over[games]):
            self._name_the_fault(views, games, agents)
        return batch

    def _batch(self, views: list[Any]) -> Any:
        space = self.single_observation_space
        return gym.vector.utils.concatenate(
            space, views, gym.vector.utils.create_empty_array(space, len(views)))

    def _name_the_fault(self, views: list[Any], games: list[int], agents: list[str]) -> None:
        for view, g, a in zip(views, games, agents, strict=True):
            self._check.check(view, self._where, f" for {a}")
            check_mask(np.asarray(view["action_mask"]), int(self.single_action_space.n),
                       self.env_id, bool(self.over[g]), f" for {a}")  # fmt: skip

    def _fine(self, batch: dict[str, np.ndarray], ended: np.ndarray) -> bool:
        """Whether every view in ``batch`` is finite with a mask of 0s and 1s, one legal move
        in each game not ``ended``: the per-view checks' verdict, a few array operations a
        turn rather than a few per game."""
        for value in batch.values():
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                return False
        mask = batch["action_mask"]
        return not ((mask != 0) & (mask != 1)).any() and bool(mask[~ended].any(axis=1).all())

    # ------------------------------------------------------------------ playing
    def _begin(self, g: int) -> None:
        """A new episode of game ``g``: the next seat, a new opponent, the opponent's opening
        move if it has the first seat."""
        seed = None if self._seed is None else self._seed + g + self.num_envs * int(
            self.episodes[g])  # fmt: skip
        self.games[g].reset(seed=seed)
        self.seat[g] = (g + self.episodes[g]) % 2
        self.episodes[g] += 1
        self.opponent[g] = self.opponents.draw()
        self.over[g] = False
        self.outcome[g] = 0.0
        self.history[g] = []

    def _replies(self, gains: np.ndarray) -> None:
        """The opponents' moves in every game where it is their turn, batched by opponent."""
        waiting = [g for g in range(self.num_envs) if not self.over[g]
                   and self.games[g].agent_selection != self.learner(g)]  # fmt: skip
        for which in np.unique(self.opponent[waiting]) if waiting else []:
            mine = [g for g in waiting if self.opponent[g] == which]
            batch = self._views(mine, [self.games[g].agent_selection for g in mine])
            moves = self.opponents.act(int(which), batch, [self.history[g] for g in mine])
            for g, move in zip(mine, moves, strict=True):
                self._move(g, int(move), gains)

    def _move(self, g: int, move: int, gains: np.ndarray) -> None:
        game = self.games[g]
        game.step(move)
        self.history[g].append(move)
        self.moves += 1
        me = self.learner(g)
        if self._check is not None and not one_finite_number(game.rewards[me]):
            raise UnsupportedEnv(f"{self.env_id}'s step() left the reward "
                                 f"{game.rewards[me]!r} for {me}; a reward is one finite number")
        gains[g] += game.rewards[me]
        if game.terminations[me] or game.truncations[me]:
            self.over[g] = True

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self._seed = seed
        if seed is not None and hasattr(self.opponents, "seed"):
            self.opponents.seed(seed)
        # Episode counts carry on: an evaluation that resets for each game alternates seats too.
        gains = np.zeros(self.num_envs)
        for g in range(self.num_envs):
            self._begin(g)
        self._replies(gains)
        return self._rows(), {}

    def step(self, actions: Any):
        self.moves = 0
        gains = np.zeros(self.num_envs)
        ended = self.over.copy()  # these only reset (next-step autoreset)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        for g in range(self.num_envs):
            if ended[g] and self.repeat:
                self._begin(g)
            elif not ended[g]:
                self._move(g, int(actions[g]), gains)
        self._replies(gains)
        gains[ended] = 0.0  # a reset step earns nothing
        for g in np.flatnonzero(~ended):
            self.outcome[g] += gains[g]
            if self.over[g]:
                terminated[g] = bool(self.games[g].terminations[self.learner(g)])
                truncated[g] = not terminated[g]
        if hasattr(self.opponents, "step"):
            self.opponents.step(self.num_envs)
            self.opponents.keep(set(self.opponent[~self.over].tolist()))
        return self._rows(), gains.astype(np.float32), terminated, truncated, {}

    def bind_policy(self, policy: Any) -> None:
        """The policy acting for the learner, whose past selves become opponents (the
        environment loop hands it over)."""
        if hasattr(self.opponents, "bind"):
            self.opponents.bind(policy)

    def close_extras(self, **kwargs: Any) -> None:
        for game in getattr(self, "games", []):
            game.close()
