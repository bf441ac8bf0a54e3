"""Tiny deterministic environments with known optimal returns, for fast end-to-end tests.

They are registered with Gymnasium under the ``rlherd/`` namespace, so ``rlherd.envs.make`` and
``gymnasium.make`` both build them.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class Bandit(gym.Env):
    """A one-step bandit: arm ``k`` pays ``payouts[k]``. Optimal return: ``max(payouts)``.

    The observation is a constant, so a learner must find the best arm from rewards alone.
    """

    metadata = {"render_modes": []}

    def __init__(
        self, payouts: tuple[float, ...] = (0.0, 0.2, 1.0, 0.5), render_mode: str | None = None
    ):
        self.render_mode = render_mode
        self.payouts = np.asarray(payouts, dtype=np.float32)
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(len(payouts))

    @property
    def optimal_return(self) -> float:
        return float(self.payouts.max())

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.ones(1, dtype=np.float32), {}

    def step(self, action):
        return np.ones(1, dtype=np.float32), float(self.payouts[int(action)]), True, False, {}


class Corridor(gym.Env):
    """A corridor of ``length`` cells; start at cell 0, actions 0 = left, 1 = right.

    Reaching the last cell terminates with reward +1; every step costs ``step_cost``. Episodes are
    truncated after ``max_steps``. The optimal return is ``1 - (length - 1) * step_cost`` and
    needs credit assignment over ``length - 1`` steps, which tests discounting and bootstrapping.
    The observation is a one-hot of the current cell.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        length: int = 6,
        step_cost: float = 0.01,
        max_steps: int = 50,
        render_mode: str | None = None,
    ):
        self.render_mode = render_mode
        if length < 2:
            raise ValueError(f"Corridor length must be >= 2, got {length}")
        self.length, self.step_cost, self.max_steps = length, step_cost, max_steps
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(length,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._pos = 0
        self._t = 0

    @property
    def optimal_return(self) -> float:
        return 1.0 - (self.length - 1) * self.step_cost

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.length, dtype=np.float32)
        obs[self._pos] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._pos, self._t = 0, 0
        return self._obs(), {}

    def expert_action(self) -> int:
        """The optimal policy's action (right), for scripted demonstrations."""
        return 1

    def step(self, action):
        self._pos = (
            min(self._pos + 1, self.length - 1) if int(action) == 1 else max(self._pos - 1, 0)
        )
        self._t += 1
        terminated = self._pos == self.length - 1
        reward = (1.0 if terminated else 0.0) - self.step_cost
        return self._obs(), reward, terminated, self._t >= self.max_steps and not terminated, {}


class DictCorridor(Corridor):
    """The corridor seen as a dict of arrays of three kinds, with an action mask: ``cell`` (a
    ``Discrete``), ``ends`` (a ``MultiBinary``: at the left end, at the right end) and
    ``action_mask`` (PettingZoo's convention: moving left from the left end is illegal, and
    stepping illegally is an error). The same task as :class:`Corridor` (same optimal return),
    for tests of structured observations and masks in every agent and runtime."""

    def __init__(self, length: int = 6, step_cost: float = 0.01, max_steps: int = 50,
                 render_mode: str | None = None):  # fmt: skip
        super().__init__(length, step_cost, max_steps, render_mode)
        self.observation_space = gym.spaces.Dict({
            "cell": gym.spaces.Discrete(length),
            "ends": gym.spaces.MultiBinary(2),
            "action_mask": gym.spaces.MultiBinary(2),
        })  # fmt: skip

    def _obs(self) -> dict[str, np.ndarray]:
        at_left = self._pos == 0
        return {
            "cell": np.int64(self._pos),
            "ends": np.array([at_left, self._pos == self.length - 1], dtype=np.int8),
            "action_mask": np.array([not at_left, True], dtype=np.int8),
        }

    def step(self, action):
        if int(action) == 0 and self._pos == 0:
            raise ValueError("DictCorridor: moving left at the left end is illegal (masked)")
        return super().step(action)


class Reach(gym.Env):
    """A point on a line starts at 0 and must reach a goal drawn uniformly from ``[-1, 1]`` at
    reset (the observation is ``[position, goal]``). The action in ``[-1, 1]`` moves the point by
    ``step_size * action``; every step costs the distance left, and coming within ``tolerance``
    of the goal ends the episode with reward +1. Episodes are truncated after ``max_steps``.

    The best action is inside the box (the distance left, over ``step_size``), so a
    deterministic policy can learn it by following its critic's gradient. The optimal return
    averages about 0.88 (one step to goals within 0.6, two to the others); random actions get
    about -11. It needs the policy to read its observation and a critic that bootstraps."""

    metadata = {"render_modes": []}

    def __init__(self, step_size: float = 0.5, tolerance: float = 0.1, max_steps: int = 20,
                 render_mode: str | None = None):  # fmt: skip
        self.render_mode = render_mode
        self.step_size, self.tolerance, self.max_steps = step_size, tolerance, max_steps
        self.observation_space = gym.spaces.Box(-2.0, 2.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self._pos, self._goal, self._t = 0.0, 1.0, 0

    def _obs(self) -> np.ndarray:
        return np.array([self._pos, self._goal], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._pos, self._t = 0.0, 0
        self._goal = float(self.np_random.uniform(-1.0, 1.0))
        return self._obs(), {}

    def step(self, action):
        move = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
        self._pos = float(np.clip(self._pos + self.step_size * move, -2.0, 2.0))
        self._t += 1
        distance = abs(self._goal - self._pos)
        terminated = distance <= self.tolerance
        reward = 1.0 if terminated else -distance
        return self._obs(), reward, terminated, self._t >= self.max_steps and not terminated, {}


class DeepSea(gym.Env):
    """bsuite's deep sea (Osband et al. 2019), deterministic: an ``size`` x ``size`` grid whose
    agent starts at the top left and falls one row per step. One action moves it a column right,
    at a cost of ``0.01 / size``; the other moves it left for free; which is which is drawn per
    cell from ``mapping_seed``. Moving right in the bottom-right cell pays +1, and the episode ends
    after ``size`` steps. The optimal return is 0.99, reached only by going right every step
    (probability ``2 ** -size`` for random actions), and every myopic signal says go left: the
    exploration test that dithering agents (epsilon-greedy DQN) fail and search with a perfect
    simulator solves. The observation is the one-hot grid of the agent's cell."""

    metadata = {"render_modes": []}

    def __init__(self, size: int = 10, mapping_seed: int = 0, render_mode: str | None = None):
        if size < 2:
            raise ValueError(f"DeepSea size must be >= 2, got {size}")
        self.size, self.render_mode = size, render_mode
        self.mapping = np.random.default_rng(mapping_seed).integers(0, 2, (size, size))
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(size, size), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._row, self._column = 0, 0

    @property
    def optimal_return(self) -> float:
        return 0.99

    def _obs(self, row: int) -> np.ndarray:
        obs = np.zeros((self.size, self.size), dtype=np.float32)
        obs[row, self._column] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._row, self._column = 0, 0
        return self._obs(0), {}

    def expert_action(self) -> int:
        """The optimal policy's action here (the one that moves right): rlherd's scripted
        expert, whose episodes are demonstrations (``--demonstrations expert``)."""
        return int(self.mapping[self._row, self._column])

    def step(self, action):
        right = int(action) == self.mapping[self._row, self._column]
        reward = 1.0 if right and self._column == self.size - 1 else 0.0
        if right:
            self._column = min(self._column + 1, self.size - 1)
            reward -= 0.01 / self.size
        else:
            self._column = max(self._column - 1, 0)
        self._row += 1
        terminated = self._row == self.size
        return self._obs(self._row - 1 if terminated else self._row), reward, terminated, False, {}


class MaskedCartPole(CartPoleEnv):
    """CartPole with only the cart's position and the pole's angle observed: the velocities
    are hidden, so a feed-forward agent cannot tell a pole falling left from one rising right,
    and one that remembers (an LSTM over the last few observations) can. Dynamics, reward (+1
    per step) and the 500-step limit are CartPole-v1's; the optimal return is 500."""

    OBSERVED = (0, 2)  # cart position, pole angle (of x, x_dot, theta, theta_dot)

    def __init__(self, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        full = self.observation_space
        keep = list(self.OBSERVED)
        self.observation_space = gym.spaces.Box(full.low[keep], full.high[keep], dtype=np.float32)

    @property
    def optimal_return(self) -> float:
        return 500.0

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return obs[list(self.OBSERVED)], info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[list(self.OBSERVED)], reward, terminated, truncated, info


def register() -> None:
    """Register the toy environments with Gymnasium (idempotent)."""
    toys = (
        ("rlherd/Bandit-v0", Bandit),
        ("rlherd/Corridor-v0", Corridor),
        ("rlherd/DictCorridor-v0", DictCorridor),
        ("rlherd/Reach-v0", Reach),
        ("rlherd/DeepSea-v0", DeepSea),
        ("rlherd/Faulty-v0", Faulty),
    )
    for name, entry in toys:
        if name not in gym.registry:
            gym.register(id=name, entry_point=entry)
    if "rlherd/MaskedCartPole-v1" not in gym.registry:
        gym.register(id="rlherd/MaskedCartPole-v1", entry_point=MaskedCartPole,
                     max_episode_steps=500)  # fmt: skip


class Faulty(gym.Env):
    """A corridor-like environment that misbehaves at step ``at`` of its life, for testing how
    vector environments handle faults: ``mode`` is ``"raise"`` (an exception), ``"hang"``
    (sleeps ``hang_s`` seconds) or ``"exit"`` (the process dies)."""

    metadata = {"render_modes": []}

    def __init__(self, at: int = 3, mode: str = "raise", hang_s: float = 60.0, render_mode=None):
        if mode not in ("raise", "hang", "exit"):
            raise ValueError(f"mode must be raise, hang or exit, got {mode!r}")
        self.at, self.mode, self.hang_s, self.render_mode = at, mode, hang_s, render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action):
        self._steps += 1
        if self._steps == self.at:
            if self.mode == "raise":
                raise ValueError(f"Faulty environment fails at step {self.at}")
            if self.mode == "hang":
                time.sleep(self.hang_s)
            else:
                os._exit(3)
        return np.zeros(1, dtype=np.float32), 0.0, False, False, {}
