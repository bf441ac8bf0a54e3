"""PettingZoo's games for the host runtimes: every agent of every parallel game is one row of a
vector environment, so one policy can act for all of them (a shared policy: PettingZoo's and
SuperSuit's "agents as environments", PufferLib's emulation), or each policy of the run's
mapping (:func:`assign_policies`; :mod:`rlherd.agents.groups`) for its agents' rows. Turn-based
games are played by self-play instead, one row per game (:mod:`rlherd.envs.turns`).

Ids name the module that holds the game, as an import path after ``pettingzoo/``:
``pettingzoo/mpe2.simple_spread_v3`` (the ``mpe2`` package) or
``pettingzoo/pettingzoo.butterfly.pistonball_v6``. The module's
``parallel_env(**env_kwargs)`` makes the game. Rows are ordered game by game, each game's agents
in ``possible_agents`` order, so ``num_envs`` rows hold ``num_envs / agents`` games.

Agents come and go: one that is done (killed in ``knights_archers_zombies``) leaves its game,
and one may join later. While its agent is away, a row is :attr:`AgentRows.absent`: the
environment loop skips its steps (no transition is learned from, no step or return counted), as
it skips an autoreset. A game ends when all its agents are done (PettingZoo's ``agents`` list
empties); the next step only resets it (Gymnasium's next-step autoreset, as every vector
environment of rlherd's). Its agents share one action space; observations that are vectors of
different lengths (MPE's adversaries and agents) are padded with zeros to the longest, so every
row has one shape (each policy still has its own network: :func:`assign_policies`). What
``--total-steps`` counts is environment steps (a step of every game), not agent steps:
:attr:`AgentRows.agents_per_game` rows make one environment step.
"""

from __future__ import annotations

import fnmatch
import importlib
import re
from typing import Any

import gymnasium as gym
import numpy as np

from rlherd.core import flatten_space, flatten_value
from rlherd.envs.ids import PETTINGZOO as PREFIX
from rlherd.envs.wrappers import FlatView, one_finite_number
from rlherd.errors import ConfigError, MissingExtra, UnsupportedEnv

# Packages whose games rlherd knows how to install.
INSTALL = {name: "pip install 'rlherd[multiagent]'" for name in ("mpe2", "pettingzoo")}
# The games of these packages keep to their spaces: not checked at every step.
KNOWN_GAMES = tuple(f"{PREFIX}{name}." for name in INSTALL)


def game_module(env_id: str) -> Any:
    """The module ``env_id`` names: a parallel game's (``parallel_env``) or a turn-based one's
    (``env``, the AEC API)."""
    module_name = env_id[len(PREFIX):]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        root = module_name.split(".")[0]
        hint = INSTALL.get(root, f"install the package that provides {module_name}")
        raise MissingExtra(
            f"{env_id}: no module {e.name!r} ({hint}); a PettingZoo id is pettingzoo/<module>, "
            "e.g. pettingzoo/mpe2.simple_spread_v3"
        ) from e
    if not hasattr(module, "parallel_env") and not hasattr(module, "env"):
        raise ConfigError(f"{env_id}: {module_name} has no parallel_env() or env(); name the "
                          "module of one game, e.g. pettingzoo/mpe2.simple_spread_v3")  # fmt: skip
    return module


def turn_based(env_id: str) -> bool:
    """Whether ``env_id`` is a turn-based (AEC-only) game, played by self-play
    (:mod:`rlherd.envs.turns`)."""
    return not hasattr(game_module(env_id), "parallel_env")


def make_game(env_id: str, /, **kwargs: Any) -> Any:
    """The parallel game ``env_id`` names, made by its module's ``parallel_env``."""
    module = game_module(env_id)
    if not hasattr(module, "parallel_env"):
        raise ConfigError(f"{env_id} is turn-based (it has no parallel_env): rlherd plays it "
                          "by self-play, one row per game")  # fmt: skip
    try:
        return module.parallel_env(**kwargs)
    except TypeError as e:
        if kwargs:
            raise ConfigError(f"{env_id} does not take the options {kwargs}: {e}") from e
        raise


def game_rows(env_id: str, rows: int, selfplay: dict[str, Any] | None = None,
              agent_index: bool = False, **kwargs: Any) -> gym.vector.VectorEnv:  # fmt: skip
    """``rows`` rows of ``env_id``'s games: a parallel game's agents (:class:`AgentRows`, rows a
    multiple of its agents), or turn-based games, one row each (:class:`TurnGames`), against
    the learner's past selves as ``selfplay`` says (``every``, ``latest``, ``size``, ``seed``)
    or, without it, a random opponent. ``agent_index`` adds each agent's index to its
    observation (a parallel game's)."""
    from rlherd.envs.turns import OpponentPool, RandomMoves, TurnGames

    module = game_module(env_id)
    if not hasattr(module, "parallel_env"):
        opponents = OpponentPool(**selfplay) if selfplay else RandomMoves()
        return TurnGames(env_id, module, rows, opponents, **kwargs)
    probe = make_game(env_id, **kwargs)
    agents = len(probe.possible_agents)
    probe.close()
    if rows % agents:
        raise ConfigError(
            f"{env_id} has {agents} agents a game, and every game's agents act together: "
            f"{rows} environments (agents) is not a multiple of {agents}; set --num-envs (or "
            f"--envs-per-actor) to one, e.g. {agents * max(1, rows // agents)}"
        )
    return AgentRows(env_id, rows // agents, agent_index, **kwargs)


def one_game(env_id: str, /, agent_index: bool = False, **kwargs: Any) -> gym.vector.VectorEnv:
    """One game of ``env_id`` as rows (its agents; a turn-based game's learner seat, against
    random moves): what a spec is read from and an evaluation plays."""
    if turn_based(env_id):
        return game_rows(env_id, 1, **kwargs)
    return AgentRows(env_id, 1, agent_index, **kwargs)


def assign_policies(agents: list[str], setting: str, same_spaces: bool = True) -> tuple[str, ...]:
    """The policy of each agent (a run's ``policies`` setting; the guide "Many agents"):

    - ``""`` (the default): ``shared`` where all agents observe and act in the same spaces,
      else one policy per id prefix (``adversary_0`` -> ``adversary``);
    - ``shared``: one policy, named ``shared``, for every agent;
    - ``independent``: one per agent, named by its id;
    - ``NAME=PATTERN,NAME=PATTERN,...``: groups by shell patterns on ids
      (``adversary=adversary_*,agent=agent_*``); an agent joins the first group it matches.

    >>> assign_policies(["adversary_0", "adversary_1", "agent_0"], "", same_spaces=False)
    ('adversary', 'adversary', 'agent')
    """
    if not setting:
        setting = "shared" if same_spaces else "prefix"
    if setting == "shared":
        return ("shared",) * len(agents)
    if setting in ("independent", "prefix"):
        strip = setting == "prefix"
        return tuple(re.sub(r"\W", "_", re.sub(r"_\d+$", "", a) if strip else a) for a in agents)
    groups = []
    for part in setting.split(","):
        name, _, patterns = part.partition("=")
        name = name.strip()
        if not patterns or not name.isidentifier():
            raise ConfigError(
                f"policies={setting!r}: expected shared, independent or NAME=PATTERN,... with "
                "names that are identifiers (e.g. adversary=adversary_*,agent=agent_*)"
            )
        groups.append((name, patterns.strip()))
    out = []
    for agent in agents:
        match = next((name for name, pattern in groups if fnmatch.fnmatchcase(agent, pattern)),
                     None)  # fmt: skip
        if match is None:
            raise ConfigError(f"policies={setting!r}: agent {agent} matches no pattern; the "
                              f"game's agents are {', '.join(agents)}")  # fmt: skip
        out.append(match)
    empty = [name for name, _ in groups if name not in out]
    if empty:
        raise ConfigError(f"policies={setting!r}: {', '.join(empty)} matches none of the "
                          f"game's agents ({', '.join(agents)})")  # fmt: skip
    return tuple(out)


def policies_of(env_id: str, /, setting: str, **kwargs: Any) -> tuple[str, ...]:
    """The policy of each agent of ``env_id``'s parallel game (see :func:`assign_policies`)."""
    rows = AgentRows(env_id, 1, **kwargs)
    rows.close()
    return assign_policies(rows.possible_agents, setting, rows.same_spaces)


class AgentRows(gym.vector.VectorEnv):
    """``games`` parallel games, one row per (game, agent); see the module docstring."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, env_id: str, games: int, agent_index: bool = False, **kwargs: Any):
        self.env_id, self.games = env_id, [make_game(env_id, **kwargs) for _ in range(games)]
        first = self.games[0]
        self.possible_agents = list(first.possible_agents)
        self.agents_per_game = len(self.possible_agents)
        self._index = {a: i for i, a in enumerate(self.possible_agents)}  # an agent's row in a game
        obs_spaces = {a: first.observation_space(a) for a in self.possible_agents}
        # A game of one's own is held to its spaces at every step, as StepCheck holds one's own
        # environment; PettingZoo's and MPE's own games are not.
        self._checked = None if env_id.startswith(KNOWN_GAMES) else {
            a: FlatView(space, env_id) for a, space in obs_spaces.items()}
        act_spaces = {a: first.action_space(a) for a in self.possible_agents}
        agent = self.possible_agents[0]
        self._legal: np.ndarray | None = None  # each agent's actions, where their counts differ
        single_action_space = act_spaces[agent]
        if any(s != act_spaces[agent] for s in act_spaces.values()):
            single_action_space = self._masked_actions(env_id, act_spaces)
        self.same_spaces = all(s == obs_spaces[agent] for s in obs_spaces.values()) and (
            self._legal is None)  # fmt: skip
        self.raw_space = obs_spaces[agent]
        self._pad = 0  # observations padded to this length (vectors of different lengths)
        if not self.same_spaces:
            self.raw_space = self.raw_space_of(env_id, list(obs_spaces.values()))
            self._pad = self.raw_space.shape[0]
        if isinstance(self.raw_space, gym.spaces.Box):
            self.single_observation_space, self.dropped = self.raw_space, []
        else:
            self.single_observation_space, self.dropped = flatten_space(self.raw_space,
                                                                        f"{env_id}'s")
        if self._legal is not None:  # the legal actions, as PettingZoo's masks say them
            space = self.single_observation_space
            mask = gym.spaces.Box(0, 1, (single_action_space.n,), np.int8)
            leaves = space.spaces if isinstance(space, gym.spaces.Dict) else {"observation": space}
            self.single_observation_space = gym.spaces.Dict({**leaves, "action_mask": mask})
        self.agent_index = agent_index
        if agent_index:
            self.single_observation_space = self._indexed(self.single_observation_space)
        self.single_action_space = single_action_space
        self.num_envs = games * self.agents_per_game
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, self.num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self._obs: list[dict[str, Any]] = [{} for _ in self.games]
        self._over = np.zeros(games, dtype=bool)  # ended: the next step resets the game
        # What an agent that has not joined its game yet observes: zeros.
        space = self.single_observation_space
        self._zeros = ({k: np.zeros(s.shape, s.dtype) for k, s in space.spaces.items()}
                       if isinstance(space, gym.spaces.Dict)
                       else np.zeros(space.shape, space.dtype))  # fmt: skip

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        for g, game in enumerate(self.games):
            obs, _ = game.reset(seed=None if seed is None else seed + g, options=options)
            self._obs[g] = obs
            self._check_agents(game)
            self._check_step("reset()", game.agents, obs)
        self._over[:] = False
        return self._rows(), {}

    def step(self, actions: Any):
        n = self.agents_per_game
        reward = np.zeros(self.num_envs, dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        for g, game in enumerate(self.games):
            if self._over[g]:  # the game ended with the last step: this one only resets it
                self._obs[g], _ = game.reset()
                self._check_agents(game)
                self._over[g] = False
                continue
            live = list(game.agents)
            obs, rewards, terms, truncs, _ = game.step(
                {a: actions[g * n + self._index[a]] for a in live}
            )
            self._check_step("step()", live, obs, rewards)
            for a in live:
                row = g * n + self._index[a]
                reward[row], terminated[row], truncated[row] = rewards[a], terms[a], truncs[a]
            self._check_agents(game)
            self._obs[g] = {**self._obs[g], **obs}
            self._over[g] = not game.agents or all(terms[a] or truncs[a] for a in live)
        return self._rows(), reward, terminated, truncated, {}

    def _check_step(self, call: str, agents: list[str], obs: dict[str, Any],
                    rewards: dict[str, Any] | None = None) -> None:  # fmt: skip
        """For a game of one's own: an observation for each of ``agents`` (those in the game at
        reset, those that acted at a step), held to its space (:class:`FlatView`), and
        a reward that is one finite number; a fault is one line naming the game
        and the agent, not numpy's error inside the batch, a divergence blamed on the learning
        rate, or an agent left seeing its last observation."""
        if self._checked is None:
            return
        for a in agents:
            if a not in obs:
                raise UnsupportedEnv(f"{self.env_id}'s {call} returned no observation for {a}, "
                                     f"which {'acted' if rewards is not None else 'is in the game'}"
                                     )  # fmt: skip
            view, where, whose = self._checked[a], f"{self.env_id}'s {call}", f" for {a}"
            view.check(view.flat(obs[a], where, whose), where, whose)
            if rewards is not None and not one_finite_number(rewards.get(a)):
                raise UnsupportedEnv(f"{self.env_id}'s {call} returned the reward "
                                     f"{rewards.get(a)!r} for {a}; a reward is one finite "
                                     "number")  # fmt: skip

    def _check_agents(self, game: Any) -> None:
        strangers = set(game.agents) - self._index.keys()  # every step: no set of the index
        if strangers:
            raise ConfigError(f"{self.env_id}: {', '.join(sorted(strangers))} joined the game "
                              "but is not one of its possible_agents")  # fmt: skip

    @property
    def absent(self) -> np.ndarray:
        """The rows whose agent is not in its game now (it left, or has not joined yet; all of a
        game that just ended): their next step is not theirs, so the environment loop passes
        it to the actor as a skipped step, as it does an autoreset, and nothing is learned from
        it or counted."""
        out = np.zeros(self.num_envs, dtype=bool)
        n = self.agents_per_game
        for g, game in enumerate(self.games):
            present = () if self._over[g] else set(game.agents)
            out[g * n:(g + 1) * n] = [a not in present for a in self.possible_agents]
        return out

    def _rows(self) -> Any:
        """Each game's agents' observations, game by game, as one batch (an agent that has not
        joined yet observes zeros; one that left, its last observation)."""
        rows = [self._view(self._obs[g][a], i) if a in self._obs[g] else self._zeros
                for g in range(len(self.games))
                for i, a in enumerate(self.possible_agents)]  # fmt: skip
        return gym.vector.utils.concatenate(
            self.single_observation_space, rows, gym.vector.utils.create_empty_array(
                self.single_observation_space, self.num_envs)
        )

    @staticmethod
    def raw_space_of(env_id: str, spaces: list[gym.Space]) -> gym.spaces.Box:
        """One space for observations that are vectors of different lengths: the longest,
        padded with zeros (others cannot be joined into one batch)."""
        if not all(isinstance(s, gym.spaces.Box) and len(s.shape) == 1 for s in spaces):
            raise ConfigError(
                f"{env_id}'s agents observe in different spaces that are not all vectors "
                f"({', '.join(sorted(set(map(str, spaces))))}); rlherd's host runtimes can join "
                "only vectors of different lengths (padded) into one batch"
            )
        size = max(s.shape[0] for s in spaces)
        low = np.zeros(size, np.float32)
        high = np.zeros(size, np.float32)
        for s in spaces:
            low[: s.shape[0]] = np.minimum(low[: s.shape[0]], s.low)
            high[: s.shape[0]] = np.maximum(high[: s.shape[0]], s.high)
        return gym.spaces.Box(low, high, (size,), np.float32)

    def _masked_actions(self, env_id: str, spaces: dict[str, gym.Space]) -> gym.spaces.Discrete:
        """Agents that choose among different numbers of actions (MPE's speaker 3, listener 5)
        share the largest count, each masked to its own (``obs["action_mask"]``, which every
        agent honours); other differing action spaces cannot share a batch."""
        if not all(isinstance(s, gym.spaces.Discrete) and s.start == 0 for s in spaces.values()):
            names = ", ".join(sorted(set(map(str, spaces.values()))))
            raise ConfigError(f"{env_id}'s agents act in different spaces ({names}); rlherd's "
                              "host runtimes join only discrete ones (masked to each agent's "
                              "actions) into one batch")  # fmt: skip
        self._legal = np.array([int(spaces[a].n) for a in self.possible_agents])
        return gym.spaces.Discrete(int(self._legal.max()))

    def _indexed(self, space: gym.Space) -> gym.Space:
        """``space`` with the agent's index (one-hot) as an input (the ``agent_index`` setting):
        after a vector, or as a dict observation's ``agent_index``."""
        n = self.agents_per_game
        if isinstance(space, gym.spaces.Dict):
            return gym.spaces.Dict({**space.spaces, "agent_index": gym.spaces.Box(0, 1, (n,))})
        if len(space.shape) != 1:
            raise ConfigError(f"agent_index adds the agent's index to vector or dict "
                              f"observations; {self.env_id} observes {space}")  # fmt: skip
        low = np.concatenate([space.low, np.zeros(n)]).astype(np.float32)
        high = np.concatenate([space.high, np.ones(n)]).astype(np.float32)
        return gym.spaces.Box(low, high, dtype=np.float32)

    def _view(self, obs: Any, index: int) -> Any:
        if self._pad:
            obs = np.pad(np.asarray(obs, np.float32), (0, self._pad - len(obs)))
        elif not isinstance(self.raw_space, gym.spaces.Box):
            obs = flatten_value(self.raw_space, obs)
        if self._legal is not None:
            mask = (np.arange(self._legal.max()) < self._legal[index]).astype(np.int8)
            obs = {**(obs if isinstance(obs, dict) else {"observation": obs}), "action_mask": mask}
        if not self.agent_index:
            return obs
        one_hot = np.eye(self.agents_per_game, dtype=np.float32)[index]
        if isinstance(obs, dict):
            return {**obs, "agent_index": one_hot}
        return np.concatenate([np.asarray(obs, np.float32), one_hot])

    def close_extras(self, **kwargs: Any) -> None:
        for game in getattr(self, "games", []):  # none where making them failed
            game.close()
