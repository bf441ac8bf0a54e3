"""A test environment whose observation nests arrays of every dtype an observation may hold, for
the round-trip tests of structured observations (buffers, tables, wire, datasets)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

import rlherd


class MixedCorridor(gym.Env):
    """A corridor of five cells, the goal at the right end, seen through arrays of every dtype
    an observation may hold, nested as an environment may nest them (rlherd.envs.make flattens
    them to ``image``, ``agent.cell``, ...). ``agent.stats`` holds int64 values that float32
    cannot carry, so anything that cast an observation to floats would not give back what was
    recorded."""

    LENGTH, LIMIT = 5, 20

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, (2, self.LENGTH), np.uint8),  # the agent at 255
            "agent": gym.spaces.Dict({
                "cell": gym.spaces.Discrete(self.LENGTH, start=1),  # counted from 1 here
                "to_goal": gym.spaces.Box(-self.LENGTH, self.LENGTH, (1,), np.int16),
                "stats": gym.spaces.Box(-(2**62), 2**62, (2,), np.int64),
                "grid": gym.spaces.MultiDiscrete([self.LENGTH, 2]),
            }),
            "visited": gym.spaces.MultiBinary(self.LENGTH),  # int8
            "at_wall": gym.spaces.Box(0, 1, (1,), bool),
            "noise": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        })  # fmt: skip
        self.action_space = gym.spaces.Discrete(2)  # left, right

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cell, self.steps = 0, 0
        self.visited = np.zeros(self.LENGTH, np.int8)
        return self._observe(), {}

    def step(self, action):
        self.cell = int(np.clip(self.cell + (1 if action == 1 else -1), 0, self.LENGTH - 1))
        self.steps += 1
        at_goal = self.cell == self.LENGTH - 1
        return self._observe(), float(at_goal), at_goal, self.steps >= self.LIMIT, {}

    def render(self):
        frame = np.zeros((8, 8 * self.LENGTH, 3), np.uint8)
        frame[:, 8 * self.cell : 8 * self.cell + 8] = 255
        return frame

    def _observe(self):
        self.visited[self.cell] = 1
        image = np.zeros((2, self.LENGTH), np.uint8)
        image[0, self.cell] = 255
        return {
            "image": image,
            "agent": {
                "cell": self.cell + 1,
                "to_goal": np.array([self.LENGTH - 1 - self.cell], np.int16),
                "stats": 2**40 + np.array([self.cell, self.steps], np.int64),
                "grid": np.array([self.cell, self.cell % 2], np.int64),
            },
            "visited": self.visited.copy(),
            "at_wall": np.array([self.cell in (0, self.LENGTH - 1)]),
            "noise": self.np_random.uniform(-1, 1, 2).astype(np.float32),
        }


@rlherd.env_factory
def mixed_corridor(render_mode: str | None = None) -> gym.Env:
    """An environment factory (``mixed_env:mixed_corridor``)."""
    return MixedCorridor(render_mode)


MIXED = "mixed_env:mixed_corridor"  # an environment factory's id


def assert_same(expected, actual) -> None:
    """Equal values and dtypes: of two arrays, or of each array of two dict observations."""
    if isinstance(expected, dict):
        assert expected.keys() == actual.keys()
        for key in expected:
            assert_same(expected[key], actual[key])
        return
    expected, actual = np.asarray(expected), np.asarray(actual)
    assert expected.dtype == actual.dtype, (expected.dtype, actual.dtype)
    assert np.array_equal(expected, actual)
