"""CartPole-v1 on a torch device: Gymnasium's dynamics (Euler integration, the same constants,
termination and 500-step limit) for thousands of carts at once, to train a single agent
entirely on the device."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch

from rlherd.envs.device.base import DeviceEnv

GRAVITY, MASS_CART, MASS_POLE, LENGTH, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS, POLE_MASS_LENGTH = MASS_CART + MASS_POLE, MASS_POLE * LENGTH
THETA_LIMIT, X_LIMIT, MAX_STEPS = 12 * 2 * math.pi / 360, 2.4, 500


class CartPole(DeviceEnv):
    """One agent per game; observation ``(x, x_dot, theta, theta_dot)``; actions 0 (push left)
    and 1 (push right); reward 1 per step; terminated when the pole falls or the cart leaves,
    truncated at 500 steps."""

    num_agents, obs_dim, action_nvec = 1, 4, (2,)

    @property
    def agent_names(self) -> list[str]:
        return ["agent"]

    def reference(self) -> GymCartPoleReference:
        return GymCartPoleReference()

    def render(self, i: int = 0) -> np.ndarray:
        """A 200x400 frame: the cart (black) and the pole (orange)."""
        x, _, theta, _ = self.state["state"][i].tolist()
        frame = np.full((200, 400, 3), 255, dtype=np.uint8)
        cx = int(200 + x / X_LIMIT * 180)
        frame[140:160, max(cx - 20, 0) : cx + 20] = 0
        for r in np.linspace(0, 90, 90):
            px, py = int(cx + r * math.sin(theta)), int(140 - r * math.cos(theta))
            if 0 <= px < 400 and 0 <= py < 200:
                frame[max(py - 2, 0) : py + 2, max(px - 2, 0) : px + 2] = (204, 153, 102)
        return frame

    def _start_state(self) -> dict[str, torch.Tensor]:
        E, d = self.num_envs, self.device
        s = torch.rand(E, 4, generator=self.generator, device=d) * 0.1 - 0.05
        return dict(state=s, timestep=torch.zeros(E, dtype=torch.int64, device=d))

    def _transition(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s, t = self.state["state"], self.state["timestep"]
        x, x_dot, theta, theta_dot = s.unbind(-1)
        force = torch.where(actions[:, 0] == 1, FORCE, -FORCE)
        cos, sin = torch.cos(theta), torch.sin(theta)
        temp = (force + POLE_MASS_LENGTH * theta_dot**2 * sin) / TOTAL_MASS
        theta_acc = (GRAVITY * sin - cos * temp) / (
            LENGTH * (4.0 / 3.0 - MASS_POLE * cos**2 / TOTAL_MASS)
        )
        x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS
        s.copy_(torch.stack([x + TAU * x_dot, x_dot + TAU * x_acc, theta + TAU * theta_dot,
                             theta_dot + TAU * theta_acc], -1))  # fmt: skip
        t += 1
        x, theta = s[:, 0], s[:, 2]
        terminated = (x.abs() > X_LIMIT) | (theta.abs() > THETA_LIMIT)
        truncated = t >= MAX_STEPS  # as Gymnasium's TimeLimit, also when the pole falls then
        return torch.ones(self.num_envs, 1, device=self.device), terminated, truncated

    def _observe(self) -> torch.Tensor:
        return self.state["state"][:, None, :]


class GymCartPoleReference:
    """Gymnasium's own CartPole-v1, started from a given state (the reference of
    :class:`CartPole` for the consistency checker)."""

    agent_names = ["agent"]

    def __init__(self):
        self.env = gym.make("CartPole-v1")

    def set_state(self, state: dict[str, np.ndarray]) -> np.ndarray:
        self.env.reset()
        self.env.unwrapped.state = state["state"].astype(np.float64)
        self.env.unwrapped.steps_beyond_terminated = None
        self.env.get_wrapper_attr("_elapsed_steps")  # fails loudly if the TimeLimit changed
        self.env.set_wrapper_attr("_elapsed_steps", int(state["timestep"]))
        return np.asarray(self.env.unwrapped.state, dtype=np.float32)[None]

    def step(self, actions: np.ndarray):
        obs, reward, terminated, truncated, _ = self.env.step(int(actions[0]))
        return np.asarray(obs)[None], np.array([reward]), bool(terminated), bool(truncated)
