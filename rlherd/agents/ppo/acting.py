"""PPO's actor: the on-policy :class:`RolloutActor` plus what PPO does to the data it produces:
reward scaling (its own running statistics, checkpointed with it) and clipping Gaussian actions
to the action box for the environment (the rollout keeps the unclipped sample, whose log
probability PPO needs). Observation statistics are the learner's, received with the parameters.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlherd.agents.acting import RolloutActor
from rlherd.core import EnvSpec
from rlherd.networks.normalization import RunningNorm


class RewardScaler:
    """Divides rewards by a running standard deviation and clips them to ``[-clip, clip]``, or
    (``"sign"``) keeps their sign only.

    ``"return"`` uses the std of each environment's discounted return (Engstrom et al.'s reward
    scaling, as SB3's VecNormalize and CleanRL); ``"reward"`` the std of the rewards themselves
    (BatchPPO). Rewards are not centred: shifting them would change which episodes end well.
    """

    def __init__(self, mode: str, num_envs: int, discount: float, clip: float = 10.0):
        self.mode, self.discount, self.clip = mode, discount, clip
        self.stats = RunningNorm((), clip=float("inf"))
        self.returns = torch.zeros(num_envs, dtype=torch.float64)

    def __call__(self, reward: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        if self.mode == "sign":
            return torch.sign(reward).float()
        live = ~skip  # autoreset steps are not part of any episode
        if self.mode == "return":
            self.returns = torch.where(skip, 0.0, self.returns * self.discount + reward)
            self.stats.update(self.returns[live])
        else:
            self.stats.update(reward[live])
        scaled = reward / torch.sqrt(self.stats.var + self.stats.eps)
        return scaled.clamp(-self.clip, self.clip).float()

    def state_dict(self) -> dict[str, Any]:
        return dict(stats=self.stats.state_dict(), returns=self.returns)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats.load_state_dict(state["stats"])
        self.returns = state["returns"]


class PPOActor(RolloutActor):
    """See the module docstring. ``reward_scaling`` is None, ``"return"`` or ``"reward"``."""

    def __init__(self, policy, writer, seed, client, spec: EnvSpec, config):
        super().__init__(policy, writer, seed, client)
        self.spec = spec
        self.scaling = (config.reward_scaling, config.discount, config.reward_clip)
        self.scaler: RewardScaler | None = None

    def env_action(self, action: torch.Tensor) -> np.ndarray:
        action = action.numpy()
        if self.spec.action_kind == "continuous":
            action = np.clip(action, self.spec.action_low, self.spec.action_high)
        return action

    def observe(self, action, reward, next_obs, terminated, truncated, skip, extras=None) -> None:
        if self.scaling[0] is not None and self.writer is not None:
            if self.scaler is None:
                self.scaler = self._make_scaler(len(reward))
            reward = self.scaler(
                torch.as_tensor(np.asarray(reward, dtype=np.float64)), torch.as_tensor(skip)
            )
        super().observe(action, reward, next_obs, terminated, truncated, skip, extras)

    def _make_scaler(self, num_envs: int) -> RewardScaler:
        mode, discount, clip = self.scaling
        return RewardScaler(mode, num_envs, discount, clip)

    def state_dict(self) -> dict[str, Any]:
        scaler = self.scaler.state_dict() if self.scaler is not None else None
        return dict(super().state_dict(), scaler=scaler)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if state["scaler"] is not None:
            self.scaler = self._make_scaler(len(state["scaler"]["returns"]))
            self.scaler.load_state_dict(state["scaler"])
