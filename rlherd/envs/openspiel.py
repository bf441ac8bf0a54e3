"""Two-player board games from OpenSpiel (``open_spiel/<game>``, e.g. ``open_spiel/tic_tac_toe``
and ``open_spiel/connect_four``) as Gymnasium environments for self-play, and the opponents
``rlherd eval --opponent`` plays them against.

One environment holds both players: each step is the move of the player whose turn it is, the
observation is that player's observation tensor, and the reward is the mover's (OpenSpiel's
reward for the player who moved: +1 for a winning move, -1 for a losing one, 0 otherwise). A
search agent negates values between plies (MCTS's ``two_player``). ``action_masks()`` says
which moves are legal now (MaskablePPO's convention, which :func:`rlherd.envs.make` moves into
the observation as ``obs["action_mask"]``, where every agent reads masks); an illegal move is an
error, never a silent loss.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np

from rlherd.errors import ConfigError, MissingExtra

PREFIX = "open_spiel/"


def _pyspiel():
    try:
        import pyspiel
    except ImportError as e:
        raise MissingExtra(
            "OpenSpiel games need the 'openspiel' extra: pip install 'rlherd[openspiel]'"
        ) from e
    return pyspiel


def load_game(name: str):
    """An OpenSpiel game that this environment can play: two players, moving in turn, zero-sum,
    without chance (a search with the game as its simulator is then exact)."""
    pyspiel = _pyspiel()
    if name not in pyspiel.registered_names():
        raise ConfigError(f"OpenSpiel has no game {name!r}; e.g. tic_tac_toe, connect_four")
    game = pyspiel.load_game(name)
    kind = game.get_type()
    if (game.num_players() != 2 or kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL
            or kind.utility != pyspiel.GameType.Utility.ZERO_SUM
            or kind.chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC):  # fmt: skip
        raise ConfigError(
            f"open_spiel/{name} is not a deterministic two-player zero-sum game of alternating "
            "moves, which is what rlherd's self-play plays"
        )
    return game


class OpenSpielEnv(gym.Env):
    """Both players of a two-player OpenSpiel game, moving in turn (see the module docstring)."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, game: str, render_mode: str | None = None):
        self.game, self.render_mode = load_game(game), render_mode
        size = self.game.observation_tensor_size()  # flat: the planes are tiny (3 x 3 x 3)
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(size,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(self.game.num_distinct_actions())
        self.state = self.game.new_initial_state()

    def __deepcopy__(self, memo: dict[int, Any]) -> OpenSpielEnv:
        """Copies share the game and clone the state (OpenSpiel's own copy)."""
        other = copy.copy(self)
        other.state = self.state.clone()
        return other

    def _obs(self, player: int) -> np.ndarray:
        return np.asarray(self.state.observation_tensor(player), dtype=np.float32)

    @property
    def current_player(self) -> int:
        return self.state.current_player()

    def action_masks(self) -> np.ndarray:
        return np.asarray(self.state.legal_actions_mask(), dtype=bool)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = self.game.new_initial_state()
        return self._obs(self.current_player), {}

    def step(self, action):
        action, mover = int(action), self.current_player
        if action not in self.state.legal_actions():
            raise ValueError(
                f"move {action} is illegal in {self.game.get_type().short_name} now (legal: "
                f"{self.state.legal_actions()}); mask actions with obs['action_mask']"
            )
        self.state.apply_action(action)
        terminated = self.state.is_terminal()
        reward = float(self.state.rewards()[mover])
        obs = self._obs(1 - mover if terminated else self.current_player)
        return obs, reward, terminated, False, {}

    def render(self):
        return str(self.state)


def register(env_id: str) -> None:
    """Register ``open_spiel/<game>`` with Gymnasium on first use (any game load_game accepts)."""
    if env_id in gym.registry:
        return
    load_game(env_id[len(PREFIX):])
    gym.register(id=env_id, entry_point=OpenSpielEnv, kwargs={"game": env_id[len(PREFIX):]})


# ---------------------------------------------------------------------------- opponents
class RandomOpponent:
    """A uniformly random legal move."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def __call__(self, env: OpenSpielEnv) -> int:
        return int(self.rng.choice(np.flatnonzero(env.action_masks())))


class MCTSOpponent:
    """OpenSpiel's C++ MCTS with random rollouts and UCT's c = 2, solving won and lost
    positions (MCTS-Solver): ``mcts:N`` searches ``N`` simulations per move."""

    def __init__(self, game, simulations: int, seed: int):
        pyspiel = _pyspiel()
        evaluator = pyspiel.RandomRolloutEvaluator(1, seed)
        self.bot = pyspiel.MCTSBot(game, evaluator, 2.0, simulations, 1000, True, seed, False)

    def __call__(self, env: OpenSpielEnv) -> int:
        return int(self.bot.step(env.state))


class PerfectOpponent:
    """Perfect play for small games such as tic-tac-toe: OpenSpiel's minimax with alpha-beta
    pruning values every legal move to the end of the game, and one of the best is drawn at
    random (a fixed choice would replay the same few games). It never loses. A position's
    best moves are kept (by its history) once searched: an evaluation's games keep coming back
    to the same positions, and searching them again cost most of its time."""

    def __init__(self, game, seed: int):
        from open_spiel.python.algorithms import minimax

        self.search, self.game = minimax.alpha_beta_search, game
        self.rng = np.random.default_rng(seed)
        self.best_moves: dict[str, list[int]] = {}

    def __call__(self, env: OpenSpielEnv) -> int:
        position = env.state.history_str()
        if position not in self.best_moves:
            player, moves = env.current_player, env.state.legal_actions()
            values = [self.search(self.game, env.state.child(a), maximizing_player_id=player)[0]
                      for a in moves]  # fmt: skip
            self.best_moves[position] = [a for a, v in zip(moves, values, strict=True)
                                         if v == max(values)]  # fmt: skip
        return int(self.rng.choice(self.best_moves[position]))


def make_opponent(spec: str, game, seed: int):
    """``random``, ``mcts:N`` or ``perfect``."""
    if spec == "random":
        return RandomOpponent(seed)
    if spec == "perfect":
        return PerfectOpponent(game, seed)
    if spec.startswith("mcts:") and spec[5:].isdigit() and int(spec[5:]) > 0:
        return MCTSOpponent(game, int(spec[5:]), seed)
    raise ConfigError(f"unknown opponent {spec!r}; use random, mcts:N (e.g. mcts:200) or perfect")
