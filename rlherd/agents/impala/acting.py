"""Acting: step a batch of environments with the current policy and write ``[T + 1, B]`` rollouts.

The same :class:`ImpalaActor` fills rollouts in the ``single`` runtime (straight into the learner's
batch) and in every ``mono`` actor process (into a shared-memory slot).
"""

from __future__ import annotations

import pickle
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlherd import types as F
from rlherd.agents.impala.networks import CoreState, ImpalaNet
from rlherd.core import EnvSpec
from rlherd.envs import save_envs

_TORCH_DTYPES = {np.dtype(np.uint8): torch.uint8, np.dtype(bool): torch.uint8}


def rollout_fields(spec: EnvSpec, num_envs: int, unroll_length: int) -> dict[str, tuple]:
    """Shapes and dtypes of one rollout, ``[T + 1, B, ...]`` per field (see rlherd.types)."""
    rows = (unroll_length + 1, num_envs)
    obs_dtype = _TORCH_DTYPES.get(spec.obs_dtype, torch.float32)
    return {
        F.OBS: (rows + spec.obs_shape, obs_dtype),
        F.RESET: (rows, torch.bool),
        F.ACTION: (rows, torch.int64),
        F.POLICY_LOGITS: (rows + (spec.num_actions,), torch.float32),
        F.BASELINE: (rows, torch.float32),
        F.REWARD: (rows, torch.float32),
        F.TERMINATED: (rows, torch.bool),
        F.TRUNCATED: (rows, torch.bool),
        F.EPISODE_RETURN: (rows, torch.float32),
        F.EPISODE_LENGTH: (rows, torch.int64),
    }


def allocate_rollout(
    fields: dict[str, tuple], share_memory: bool = False
) -> dict[str, torch.Tensor]:
    buffers = {k: torch.zeros(shape, dtype=dtype) for k, (shape, dtype) in fields.items()}
    if share_memory:
        for t in buffers.values():
            t.share_memory_()
    return buffers


def sample_actions(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One categorical sample per row of ``logits [N, A]``, drawn from ``generator``."""
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1)


class ImpalaActor:
    """Steps ``envs`` (a next-step-autoreset vector env) with ``net`` and writes rollouts.

    Consecutive rollouts overlap by one row: row ``T`` of one is row 0 of the next, with the
    action already chosen there, so the behaviour logits always belong to the action taken.
    """

    def __init__(self, net: ImpalaNet, envs: gym.vector.VectorEnv, seed: int):
        self.net = net
        # Acting on a GPU copies one row each way; poly's batched inference says where it runs.
        self.device = getattr(net, "device", None) or next(net.parameters()).device
        self.envs = envs
        self.num_envs = envs.num_envs
        self.generator = torch.Generator().manual_seed(seed)
        obs, _ = envs.reset(seed=seed)
        self.obs = torch.as_tensor(np.asarray(obs))
        self.reset = torch.zeros(self.num_envs, dtype=torch.bool)
        self.episode_return = torch.zeros(self.num_envs)
        self.episode_length = torch.zeros(self.num_envs, dtype=torch.int64)
        self.state_before: CoreState = net.initial_state(self.num_envs)
        self._act()

    @torch.no_grad()
    def _act(self) -> None:
        """Choose the action for the current row, from ``state_before``."""
        outputs, self.state_after = self.net(
            self.obs[None].to(self.device),
            torch.zeros(1, self.num_envs, dtype=torch.bool, device=self.device),
            self.state_before,
        )
        self.logits = outputs[F.POLICY_LOGITS][0].cpu()
        self.baseline = outputs[F.BASELINE][0].cpu()
        self.action = sample_actions(self.logits, self.generator)

    def _write_row(self, buf: dict[str, torch.Tensor], t: int) -> None:
        buf[F.OBS][t] = self.obs
        buf[F.RESET][t] = self.reset
        buf[F.ACTION][t] = self.action
        buf[F.POLICY_LOGITS][t] = self.logits
        buf[F.BASELINE][t] = self.baseline
        buf[F.EPISODE_RETURN][t] = self.episode_return
        buf[F.EPISODE_LENGTH][t] = self.episode_length

    @torch.no_grad()
    def unroll(self, buf: dict[str, torch.Tensor]) -> CoreState:
        """Fill ``buf`` (``[T + 1, B]`` fields) and return the core state before row 0."""
        T = buf[F.REWARD].shape[0] - 1
        initial_state = self.state_before
        self._write_row(buf, 0)
        for t in range(T):
            obs, reward, terminated, truncated, _ = self.envs.step(self.action.numpy())
            reward = torch.as_tensor(np.asarray(reward, dtype=np.float32))
            terminated = torch.as_tensor(np.asarray(terminated, dtype=bool))
            truncated = torch.as_tensor(np.asarray(truncated, dtype=bool))
            buf[F.REWARD][t] = reward
            buf[F.TERMINATED][t] = terminated
            buf[F.TRUNCATED][t] = truncated
            # An autoreset step (from a final observation) starts the next episode's statistics.
            started = self.reset
            self.episode_return = torch.where(started, 0.0, self.episode_return + reward)
            self.episode_length = torch.where(started, 0, self.episode_length + 1)
            self.obs = torch.as_tensor(np.asarray(obs))
            self.reset = terminated | truncated
            keep = (~started).float().to(self.device)
            self.state_before = tuple(s * keep[None, :, None] for s in self.state_after)
            self._act()
            self._write_row(buf, t + 1)
        return initial_state

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: the environments (when they pickle), the
        current row and the sampling RNG."""
        keys = ("obs", "reset", "episode_return", "episode_length", "state_before", "state_after")
        return dict(
            envs=save_envs(self.envs),
            generator=self.generator.get_state(),
            logits=self.logits,
            baseline=self.baseline,
            action=self.action,
            **{k: getattr(self, k) for k in keys},
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["envs"] is None:
            return  # keep the fresh environments and the row they started on
        self.envs.close()
        self.envs = pickle.loads(state["envs"])
        self.generator.set_state(state["generator"])
        for k, v in state.items():
            if k not in ("envs", "generator"):
                setattr(self, k, v)
