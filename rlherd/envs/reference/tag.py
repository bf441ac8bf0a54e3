"""Numpy references of the Tag games (``../shared/specs/tag.md``), one game per object, written
to be read: loops over agents, one rule per line. They are PettingZoo ``ParallelEnv``s and the
ground truth that :func:`rlherd.envs.device.check_consistency` holds the device versions to.

``get_state()`` / ``set_state()`` expose the full game state, so a checker can start a reference
game from exactly the state a device game drew.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

# Grid moves of actions 0..4: stay, +x, -x, +y, -y.
GRID_MOVES = np.array([[0, 0], [1, 0], [-1, 0], [0, 1], [0, -1]], dtype=np.int64)


@dataclass
class TagGridWorldConfig:
    """WarpDrive's defaults."""

    num_taggers: int = 10
    grid_length: int = 10
    episode_length: int = 100
    wall_hit_penalty: float = 0.1
    tag_reward_for_tagger: float = 10.0
    tag_penalty_for_runner: float = 2.0
    step_cost_for_tagger: float = 0.01
    use_full_observation: bool = True

    def __post_init__(self) -> None:
        if self.num_taggers < 1 or self.grid_length < 1 or self.episode_length < 1:
            raise ValueError("num_taggers, grid_length and episode_length must be >= 1")

    @property
    def num_agents(self) -> int:
        return self.num_taggers + 1

    @property
    def obs_dim(self) -> int:
        return 4 * self.num_agents + 1 if self.use_full_observation else 6


@dataclass
class TagContinuousConfig:
    """WarpDrive's defaults."""

    num_taggers: int = 1
    num_runners: int = 10
    grid_length: float = 10.0
    episode_length: int = 100
    max_speed: float = 1.0
    skill_level_tagger: float = 1.0
    skill_level_runner: float = 1.0
    max_acceleration: float = 1.0
    min_acceleration: float = -1.0
    max_turn: float = math.pi / 2
    min_turn: float = -math.pi / 2
    num_acceleration_levels: int = 10
    num_turn_levels: int = 10
    edge_hit_penalty: float = -0.0
    use_full_observation: bool = True
    num_other_agents_observed: int = 2
    tagging_distance: float = 0.01
    tag_reward_for_tagger: float = 1.0
    step_penalty_for_tagger: float = -0.0
    tag_penalty_for_runner: float = -1.0
    step_reward_for_runner: float = 0.0
    end_of_game_reward_for_runner: float = 1.0
    runner_exits_game_after_tagged: bool = True
    tagger_seed: int = 0  # which ids are taggers (drawn once, as WarpDrive does)

    def __post_init__(self) -> None:
        if self.num_taggers < 1 or self.num_runners < 1:
            raise ValueError("Tag needs at least one tagger and one runner")
        if not 1 <= self.num_other_agents_observed <= self.num_agents - 1:
            raise ValueError(
                f"num_other_agents_observed must be in [1, {self.num_agents - 1}], got "
                f"{self.num_other_agents_observed}"
            )

    @property
    def num_agents(self) -> int:
        return self.num_taggers + self.num_runners

    @property
    def obs_dim(self) -> int:
        others = (
            self.num_agents - 1 if self.use_full_observation else self.num_other_agents_observed
        )
        return 7 * others + 1

    def agent_types(self) -> np.ndarray:
        """1 for taggers, 0 for runners, per agent id (tagger ids drawn with ``tagger_seed``)."""
        types = np.zeros(self.num_agents, dtype=np.int64)
        rng = np.random.default_rng(self.tagger_seed)
        types[rng.choice(self.num_agents, self.num_taggers, replace=False)] = 1
        return types

    def acceleration_table(self) -> np.ndarray:
        """Action index -> acceleration: 0 is a no-op, then evenly spaced levels."""
        levels = np.linspace(self.min_acceleration, self.max_acceleration,
                             self.num_acceleration_levels)  # fmt: skip
        return np.concatenate([[0.0], levels]).astype(np.float32)

    def turn_table(self) -> np.ndarray:
        levels = np.linspace(self.min_turn, self.max_turn, self.num_turn_levels)
        return np.concatenate([[0.0], levels]).astype(np.float32)


# WarpDrive's training configurations (the environment side; the agent side is the ppo preset of
# the same name). Use with rlherd.train(..., env_kwargs=WARPDRIVE_TRAINING[env_id]).
WARPDRIVE_TRAINING: dict[str, dict[str, Any]] = {
    "tag-gridworld": dict(num_taggers=4, grid_length=100, tag_penalty_for_runner=5.0),
    "tag-continuous": dict(
        num_taggers=10, num_runners=100, grid_length=20.0, episode_length=500,
        max_acceleration=0.1, min_acceleration=-0.1, max_turn=3 * math.pi / 4,
        min_turn=-3 * math.pi / 4, num_acceleration_levels=20, num_turn_levels=20,
        tagging_distance=0.02, tag_reward_for_tagger=10.0, tag_penalty_for_runner=-10.0,
        use_full_observation=False, num_other_agents_observed=10,
    ),
}  # fmt: skip


class _TagReference(ParallelEnv):
    metadata = {"render_modes": [], "name": "tag", "is_parallelizable": True}

    def __init__(self, config):
        self.config = config
        self.possible_agents = self.agent_names(config)
        self.agents: list[str] = []
        self._obs_space = spaces.Box(-np.inf, np.inf, (config.obs_dim,), np.float32)
        self._action_space = self.make_action_space(config)
        self.np_random = np.random.default_rng()

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._action_space  # one object per agent, so seeding it sticks (PettingZoo)

    def get_state(self) -> dict[str, np.ndarray]:
        return {k: np.array(v, copy=True) for k, v in self.state.items()}

    def set_state(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """Continue from ``state``; returns its observations ``[num_agents, obs_dim]``."""
        self.state = {k: np.array(v, copy=True) for k, v in state.items()}
        self.agents = list(self.possible_agents)
        return self._observations()

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        self.state = self._start_state()
        self.agents = list(self.possible_agents)
        obs = self._observations()
        return {a: obs[i] for i, a in enumerate(self.agents)}, {a: {} for a in self.agents}

    def _dicts(self, obs, rewards, done: bool):
        names = self.possible_agents
        result = (
            {a: obs[i] for i, a in enumerate(names)},
            {a: float(rewards[i]) for i, a in enumerate(names)},
            {a: done for a in names},
            {a: False for a in names},
            {a: {} for a in names},
        )
        if done:
            self.agents = []
        return result


class TagGridWorldReference(_TagReference):
    """Discrete Tag on an ``(L + 1) x (L + 1)`` grid; taggers ``tagger_0..``, one ``runner``."""

    def __init__(self, **config: Any):
        super().__init__(TagGridWorldConfig(**config))

    @staticmethod
    def agent_names(config: TagGridWorldConfig) -> list[str]:
        return [f"tagger_{i}" for i in range(config.num_taggers)] + ["runner"]

    @staticmethod
    def make_action_space(config: TagGridWorldConfig) -> spaces.Space:
        return spaces.Discrete(5)

    def _start_state(self) -> dict[str, np.ndarray]:
        c = self.config
        pos = self.np_random.integers(0, c.grid_length + 1, size=(c.num_agents, 2))
        return dict(pos=pos.astype(np.int64), timestep=np.array(0, dtype=np.int64))

    def _observations(self) -> np.ndarray:
        c, pos, t = self.config, self.state["pos"], int(self.state["timestep"])
        N, L = c.num_agents, c.grid_length
        types = np.array([0.0] * c.num_taggers + [1.0])
        obs = np.zeros((N, c.obs_dim), dtype=np.float32)
        for i in range(N):
            if c.use_full_observation:
                onehot = np.zeros(N)
                onehot[i] = 1.0
                row = [pos[:, 0] / L, pos[:, 1] / L, types, onehot, [t / c.episode_length]]
                obs[i] = np.concatenate(row)
            else:
                if i < c.num_taggers:  # a tagger sees the runner
                    other = N - 1
                else:  # the runner sees its nearest tagger (lowest id on ties)
                    d2 = [((pos[j] - pos[i]) ** 2).sum() for j in range(c.num_taggers)]
                    other = int(np.argmin(d2))
                obs[i] = [pos[i, 0] / L, pos[i, 1] / L, pos[other, 0] / L, pos[other, 1] / L,
                          types[i], t / c.episode_length]  # fmt: skip
        return obs

    def step(self, actions: dict[str, int]):
        c = self.config
        N, L = c.num_agents, c.grid_length
        pos = self.state["pos"]
        rewards = np.zeros(N)
        for i, agent in enumerate(self.possible_agents):
            moved = pos[i] + GRID_MOVES[int(actions[agent])]
            clipped = np.clip(moved, 0, L)
            if (clipped != moved).any():
                rewards[i] -= c.wall_hit_penalty
            pos[i] = clipped
        self.state["timestep"] = self.state["timestep"] + 1
        tagged = any((pos[j] == pos[N - 1]).all() for j in range(c.num_taggers))
        for i in range(N):
            is_tagger = i < c.num_taggers
            if tagged:
                rewards[i] += c.tag_reward_for_tagger if is_tagger else -c.tag_penalty_for_runner
            else:
                rewards[i] += -c.step_cost_for_tagger if is_tagger else c.step_cost_for_tagger
        done = tagged or int(self.state["timestep"]) >= c.episode_length
        return self._dicts(self._observations(), rewards, done)


class TagContinuousReference(_TagReference):
    """Continuous Tag: agents with speed, direction and acceleration in a ``[0, L]^2`` arena."""

    def __init__(self, **config: Any):
        super().__init__(TagContinuousConfig(**config))
        self.types = self.config.agent_types()

    @staticmethod
    def agent_names(config: TagContinuousConfig) -> list[str]:
        types = config.agent_types()
        return [f"{'tagger' if t else 'runner'}_{i}" for i, t in enumerate(types)]

    @staticmethod
    def make_action_space(c: TagContinuousConfig) -> spaces.Space:
        return spaces.MultiDiscrete([c.num_acceleration_levels + 1, c.num_turn_levels + 1])

    def _start_state(self) -> dict[str, np.ndarray]:
        c, rng = self.config, self.np_random
        N = c.num_agents
        return dict(
            x=rng.uniform(0, c.grid_length, N).astype(np.float32),
            y=rng.uniform(0, c.grid_length, N).astype(np.float32),
            speed=np.zeros(N, np.float32),
            direction=rng.uniform(0, 2 * np.pi, N).astype(np.float32),
            acceleration=np.zeros(N, np.float32),
            in_game=np.ones(N, bool),
            timestep=np.array(0, dtype=np.int64),
        )

    def _observations(self) -> np.ndarray:
        c, s = self.config, self.state
        N, L = c.num_agents, np.float32(c.grid_length)
        t = np.float32(int(s["timestep"]) / c.episode_length)
        obs = np.zeros((N, c.obs_dim), dtype=np.float32)
        for i in range(N):
            others = [j for j in range(N) if j != i]
            if not c.use_full_observation:
                if not s["in_game"][i]:
                    continue  # all zeros
                live = [j for j in others if s["in_game"][j]]
                d2 = [(s["x"][j] - s["x"][i]) ** 2 + (s["y"][j] - s["y"][i]) ** 2 for j in live]
                order = np.argsort(np.array(d2, dtype=np.float32), kind="stable")
                others = [live[k] for k in order[: c.num_other_agents_observed]]
            width = c.obs_dim // 7
            feats = np.zeros((7, width), dtype=np.float32)
            for slot, j in enumerate(others):
                if s["in_game"][j]:
                    feats[0, slot] = (s["x"][j] - s["x"][i]) / (np.float32(np.sqrt(2)) * L)
                    feats[1, slot] = (s["y"][j] - s["y"][i]) / (np.float32(np.sqrt(2)) * L)
                    feats[2, slot] = (s["speed"][j] - s["speed"][i]) / np.float32(c.max_speed)
                    feats[3, slot] = (s["acceleration"][j] - s["acceleration"][i]) / np.float32(
                        c.max_speed
                    )
                    feats[4, slot] = (s["direction"][j] - s["direction"][i]) / np.float32(2 * np.pi)
                feats[5, slot] = self.types[j]
                feats[6, slot] = float(s["in_game"][j])
            obs[i] = np.concatenate([feats.reshape(-1), [t]])
        return obs

    def step(self, actions: dict[str, np.ndarray]):
        c, s = self.config, self.state
        N, L = c.num_agents, np.float32(c.grid_length)
        acc_table, turn_table = c.acceleration_table(), c.turn_table()
        s["timestep"] = s["timestep"] + 1
        rewards = np.zeros(N, dtype=np.float32)
        edge = np.zeros(N, bool)
        for i, agent in enumerate(self.possible_agents):
            if not s["in_game"][i]:
                continue  # frozen
            a_acc, a_turn = (int(v) for v in actions[agent])
            skill = c.skill_level_tagger if self.types[i] else c.skill_level_runner
            vmax = np.float32(c.max_speed * skill)
            s["acceleration"][i] += acc_table[a_acc]
            s["direction"][i] = np.mod(
                s["direction"][i] + turn_table[a_turn], np.float32(2 * np.pi)
            )
            speed = s["speed"][i] + s["acceleration"][i]
            if speed <= 0 or speed >= vmax:
                s["acceleration"][i] = 0.0
            s["speed"][i] = np.clip(speed, 0, vmax)
            x = s["x"][i] + s["speed"][i] * np.cos(s["direction"][i])
            y = s["y"][i] + s["speed"][i] * np.sin(s["direction"][i])
            edge[i] = not (0 <= x <= L and 0 <= y <= L)
            s["x"][i], s["y"][i] = np.clip(x, 0, L), np.clip(y, 0, L)
        obs = self._observations()  # after moving, before tagging

        taggers = [j for j in range(N) if self.types[j]]
        tagged_now = np.zeros(N, bool)
        for i in range(N):
            if not s["in_game"][i]:
                continue
            rewards[i] += c.step_penalty_for_tagger if self.types[i] else c.step_reward_for_runner
            if edge[i]:
                rewards[i] += c.edge_hit_penalty
        for i in range(N):
            if self.types[i] or not s["in_game"][i]:
                continue
            d2 = [(s["x"][j] - s["x"][i]) ** 2 + (s["y"][j] - s["y"][i]) ** 2 for j in taggers]
            nearest = taggers[int(np.argmin(d2))]
            if np.sqrt(min(d2)) < c.tagging_distance * L:
                rewards[i] += c.tag_penalty_for_runner
                rewards[nearest] += c.tag_reward_for_tagger
                tagged_now[i] = True
        for i in np.flatnonzero(tagged_now):
            if c.runner_exits_game_after_tagged:
                s["in_game"][i] = False
                s["speed"][i] = 0.0
                s["acceleration"][i] = 0.0
        if int(s["timestep"]) == c.episode_length:
            for i in range(N):
                if not self.types[i] and s["in_game"][i] and not tagged_now[i]:
                    rewards[i] += c.end_of_game_reward_for_runner
        runners_left = sum(1 for i in range(N) if not self.types[i] and s["in_game"][i])
        done = int(s["timestep"]) >= c.episode_length or runners_left == 0
        return self._dicts(obs, rewards, done)
