"""PPO's actor: samples from the current policy and writes rows into the rollout queue.

It is an :class:`~rlherd.core.Actor`, so the environment loop (TensorFlow Agents' ``simulate``)
drives it like any other. It owns the two streaming normalisers of the data it produces:
observation statistics (a module of the network, so they travel with the parameters) and the
reward scale (its own state, checkpointed with it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlherd import types as F
from rlherd.agents.ppo.config import PPOConfig
from rlherd.agents.ppo.networks import PPONet
from rlherd.core import EnvSpec
from rlherd.networks.normalization import RunningNorm
from rlherd.replay.rollouts import Fields, RolloutQueue


def rollout_fields(spec: EnvSpec, net: PPONet) -> Fields:
    """PPO's row: the observation as the policy saw it (normalised), the sampled action, its log
    probability, the distribution's parameters and the value, then the outcome."""
    continuous = spec.action_kind == "continuous"
    obs_dtype = torch.uint8 if spec.obs_dtype == np.uint8 and spec.is_image else torch.float32
    param_dim = net.policy_head.out_features * (2 if continuous else 1)
    action = {
        "discrete": ((), torch.int64),
        "multidiscrete": (spec.action_shape, torch.int64),
        "continuous": (spec.action_shape, torch.float32),
    }[spec.action_kind]
    return {
        F.OBS: (spec.obs_shape, obs_dtype),
        F.RESET: ((), torch.bool),
        F.ACTION: action,
        F.BEHAVIOUR_LOG_PROB: ((), torch.float32),
        F.POLICY_PARAMS: ((param_dim,), torch.float32),
        F.BASELINE: ((), torch.float32),
        F.REWARD: ((), torch.float32),
        F.TERMINATED: ((), torch.bool),
        F.TRUNCATED: ((), torch.bool),
    }


class RewardScaler:
    """Divides rewards by a running standard deviation and clips them to ``[-clip, clip]``.

    ``"return"`` uses the std of each environment's discounted return (Engstrom et al.'s reward
    scaling, as SB3's VecNormalize and CleanRL); ``"reward"`` the std of the rewards themselves
    (BatchPPO). Rewards are not centred: shifting them would change which episodes end well.
    """

    def __init__(self, mode: str, num_envs: int, discount: float, clip: float = 10.0):
        self.mode, self.discount, self.clip = mode, discount, clip
        self.stats = RunningNorm((), clip=float("inf"))
        self.returns = torch.zeros(num_envs, dtype=torch.float64)

    def __call__(self, reward: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
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


class PPOActor:
    """Samples actions for a batch of environments and, with a ``queue``, records the rows and
    updates the observation statistics.

    Without a queue it only acts (evaluation), with the distribution's mode if ``greedy``. Box
    actions are clipped to the space's bounds for the environment; the rollout keeps the
    unclipped sample, whose log probability PPO needs.
    """

    def __init__(
        self,
        net: PPONet,
        config: PPOConfig,
        queue: RolloutQueue | None,
        seed: int,
        greedy: bool = False,
    ):
        self.net, self.spec, self.queue, self.greedy = net, net.spec, queue, greedy
        self.device = next(net.parameters()).device
        self.generator = torch.Generator().manual_seed(seed)
        self.scaler = None
        if config.reward_scaling is not None and queue is not None:
            self.scaler = RewardScaler(
                config.reward_scaling, queue.B, config.discount, config.reward_clip
            )
        self.continuous = self.spec.action_kind == "continuous"

    @torch.no_grad()
    def select_action(self, obs: np.ndarray) -> np.ndarray:
        obs = torch.as_tensor(np.asarray(obs))
        if self.net.obs_norm is not None and self.queue is not None:
            self.net.obs_norm.update(obs)  # the statistics of every observation acted on
        x = self.net.normalize(obs.to(self.device))
        params, value = (t.cpu() for t in self.net(x))
        if self.greedy:
            action = self.net.dist.mode(params)
        else:
            action = self.net.dist.sample(params, self.generator)
        if self.queue is not None:
            self.queue.add_row(
                **{
                    F.OBS: x.cpu(),
                    F.ACTION: action,
                    F.BEHAVIOUR_LOG_PROB: self.net.dist.log_prob(params, action),
                    F.POLICY_PARAMS: params,
                    F.BASELINE: value,
                }
            )
        action = action.numpy()
        if self.continuous:
            action = np.clip(action, self.spec.action_low, self.spec.action_high)
        return action

    def observe_first(self, obs: np.ndarray, envs: np.ndarray) -> None:
        """Nothing to do: episode starts are the rows after ``reset`` ones in the rollout."""

    def observe(self, action, reward, next_obs, terminated, truncated, skip, extras=None) -> None:
        if self.queue is None:
            return
        reward = torch.as_tensor(np.asarray(reward, dtype=np.float64))
        if self.scaler is not None:
            reward = self.scaler(reward, torch.as_tensor(skip))
        self.queue.add_outcome(
            reward.float(), torch.as_tensor(terminated), torch.as_tensor(truncated)
        )

    def update(self, wait: bool = False) -> None:
        """The network is the learner's own in one process: nothing to fetch."""

    def state_dict(self) -> dict[str, Any]:
        scaler = self.scaler.state_dict() if self.scaler is not None else None
        return dict(generator=self.generator.get_state(), scaler=scaler)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
