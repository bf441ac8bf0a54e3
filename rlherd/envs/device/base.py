"""Environments that live on a torch device (WarpDrive's design, with torch instead of CUDA C).

A :class:`DeviceEnv` steps ``num_envs`` games of ``num_agents`` agents at once. Its state is a
dict of tensors ``[num_envs, ...]`` allocated once; ``reset()`` and ``step(actions)`` update
them, and the observation, reward and flag buffers, in place with vectorised torch ops. Those
buffers are the data store: a trainer reads ``obs`` / ``reward`` / ``terminated`` /
``truncated`` and passes actions without any host-device copy (nothing in ``step`` reads a
tensor back to the host, so CUDA kernels queue up without synchronising).

Next-step autoreset (DESIGN.md): a game whose previous step ended it is reset by this step
instead: its action is ignored, it gets a new start state, reward 0 and both flags false. Start
states are drawn on the device from the environment's seeded generator (fresh per game and per
episode), or, with ``fixed_start``, every game restarts from the first state drawn (WarpDrive's
behaviour).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch


class DeviceEnv(ABC):
    """Subclasses set ``num_agents``, ``obs_dim``, ``action_nvec`` (one entry: ``Discrete(n)``
    actions ``[E, N]``; several: multi-discrete ``[E, N, len(nvec)]``) and implement
    ``_start_state``, ``_transition``, ``_observe``, ``reference`` and ``agent_names``."""

    num_agents: int
    obs_dim: int
    action_nvec: tuple[int, ...]

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        fixed_start: bool = False,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs, self.device, self.fixed_start = num_envs, torch.device(device), fixed_start
        self.generator = torch.Generator(self.device).manual_seed(seed)
        E, N = num_envs, self.num_agents
        self.obs = torch.zeros(E, N, self.obs_dim, device=self.device)
        self.reward = torch.zeros(E, N, device=self.device)
        self.terminated = torch.zeros(E, dtype=torch.bool, device=self.device)
        self.truncated = torch.zeros(E, dtype=torch.bool, device=self.device)
        self.tags = torch.zeros(E, device=self.device)  # Tag: tags in each game's last step
        self.state: dict[str, torch.Tensor] = {}
        self._first_start: dict[str, torch.Tensor] | None = None

    # ---------------------------------------------------------------- subclass interface
    @abstractmethod
    def _start_state(self) -> dict[str, torch.Tensor]:
        """A fresh start state for every game (drawn from ``self.generator``)."""

    @abstractmethod
    def _transition(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Advance every game in ``self.state`` (in place); return ``(reward [E, N],
        terminated [E], truncated [E])``. Games that are resetting are overwritten after."""

    @abstractmethod
    def _observe(self) -> torch.Tensor:
        """Observations ``[E, N, obs_dim]`` of the current state."""

    @abstractmethod
    def reference(self):
        """A reference (numpy) instance of one game with the same configuration."""

    @property
    @abstractmethod
    def agent_names(self) -> list[str]:
        """The reference's agent names, in agent-index order."""

    def policy_groups(self) -> dict[str, list[int]]:
        """Agent ids per policy (WarpDrive's ``policy_tag_to_agent_id_map``); default: one."""
        return {"agent": list(range(self.num_agents))}

    def render(self, i: int = 0) -> np.ndarray:
        """An RGB frame of game ``i``."""
        raise NotImplementedError(f"{type(self).__name__} cannot render")

    @property
    def action_shape(self) -> tuple[int, ...]:
        """``[E, N]`` for discrete actions, ``[E, N, heads]`` for multi-discrete ones."""
        heads = (len(self.action_nvec),) if len(self.action_nvec) > 1 else ()
        return (self.num_envs, self.num_agents, *heads)

    # ---------------------------------------------------------------- the data store
    def _draw_start(self) -> dict[str, torch.Tensor]:
        start = self._start_state()
        if self.fixed_start:
            if self._first_start is None:
                self._first_start = {k: v.clone() for k, v in start.items()}
            start = self._first_start
        return start

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start every game; returns the observation buffer."""
        if seed is not None:
            self.generator.manual_seed(seed)
            self._first_start = None
        self.state = {k: v.clone() for k, v in self._draw_start().items()}
        self.reward.zero_()
        self.tags.zero_()
        self.terminated.zero_()
        self.truncated.zero_()
        self.obs.copy_(self._observe())
        return self.obs

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One step of every game; returns the ``obs, reward, terminated, truncated`` buffers."""
        if not self.state:
            raise RuntimeError("call reset() before step()")
        if tuple(actions.shape) != self.action_shape:
            raise ValueError(
                f"actions must have shape {self.action_shape}, got {tuple(actions.shape)}"
            )
        resetting = self.terminated | self.truncated
        reward, terminated, truncated = self._transition(actions.to(self.device))
        start = self._draw_start()
        for k, v in self.state.items():  # branch-free: no host sync to ask whether any reset
            mask = resetting.view(-1, *([1] * (v.dim() - 1)))
            v.copy_(torch.where(mask, start[k], v))
        self.reward.copy_(torch.where(resetting[:, None], 0.0, reward))
        self.tags.masked_fill_(resetting, 0.0)
        self.terminated.copy_(terminated & ~resetting)
        self.truncated.copy_(truncated & ~resetting)
        self.obs.copy_(self._observe())
        return self.obs, self.reward, self.terminated, self.truncated

    def game_state(self, i: int) -> dict[str, np.ndarray]:
        """Game ``i``'s state on the host, as its reference holds it (for the consistency
        checker and rendering); fields named ``_...`` are device bookkeeping and left out."""
        return {k: v[i].cpu().numpy() for k, v in self.state.items() if not k.startswith("_")}

    _BUFFERS = ("obs", "reward", "terminated", "truncated", "tags")

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: game states, buffers, the generator."""
        return dict(
            state={k: v.clone() for k, v in self.state.items()},
            buffers={k: getattr(self, k).clone() for k in self._BUFFERS},
            generator=self.generator.get_state(),
            first_start=self._first_start,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = {k: v.to(self.device).clone() for k, v in state["state"].items()}
        for k, v in state["buffers"].items():
            getattr(self, k).copy_(v)
        self.generator.set_state(state["generator"])
        self._first_start = state["first_start"]

    def sample_actions(self, rng: np.random.Generator) -> np.ndarray:
        """Uniform random actions for every agent of every game (host side, for checks)."""
        shape = (self.num_envs, self.num_agents)
        if len(self.action_nvec) == 1:
            return rng.integers(self.action_nvec[0], size=shape)
        return np.stack([rng.integers(n, size=shape) for n in self.action_nvec], -1)
