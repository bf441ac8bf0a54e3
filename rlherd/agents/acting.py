"""The actor every on-policy agent shares: act with a policy, write rows through a rollout writer.

:class:`RolloutActor` is an :class:`~rlherd.core.Actor`, so the environment loop drives it in
every host runtime alike; the writer it is given decides where its rollouts go (see
:mod:`rlherd.replay.rollouts`). Parameters reach it only through its variable client.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlherd import types as F
from rlherd.core import Policy, VariableClient
from rlherd.replay.rollouts import RolloutWriter


class RolloutActor:
    """Acts in a batch of environments with ``policy`` (sampling from its own ``seed``) and, with
    a ``writer``, records each row: the observation, the policy's outputs and the recurrent
    state before the row. Without a writer it only acts (an evaluator).

    Recurrent state is zeroed for environments that begin an episode (``observe_first``), so the
    state stored for a row that starts an episode is already zero, as :mod:`rlherd.types` says.
    """

    def __init__(
        self,
        policy: Policy,
        writer: RolloutWriter | None,
        seed: int,
        client: VariableClient | None = None,
    ):
        self.policy, self.writer, self.client = policy, writer, client
        device = getattr(policy, "device", torch.device("cpu"))
        self.generator = torch.Generator(device).manual_seed(seed)
        self.state: tuple[torch.Tensor, ...] | None = None
        self.first: torch.Tensor | None = None

    def observe_first(self, obs: np.ndarray, envs: np.ndarray) -> None:
        envs = torch.as_tensor(np.asarray(envs, dtype=bool))
        if self.state is None:
            self.state = self.policy.initial_state(len(envs))
            self.first = torch.zeros(len(envs), dtype=torch.bool)
        self.first |= envs
        if self.state:
            keep = (~envs).to(self.state[0].device, torch.float32)[None, :, None]
            self.state = tuple(s * keep for s in self.state)

    @torch.no_grad()
    def select_action(self, obs: np.ndarray) -> np.ndarray:
        obs = torch.as_tensor(np.asarray(obs))
        state = self.state
        outputs, self.state = self.policy(obs, self.first, state, self.generator)
        self.first = torch.zeros_like(self.first)
        if self.writer is not None:
            self.writer.add_row(core_state=state, **{F.OBS: obs}, **outputs)
        return self.env_action(outputs[F.ACTION].cpu())

    def env_action(self, action: torch.Tensor) -> np.ndarray:
        """What the environments receive (PPO clips Gaussian samples to the action box)."""
        return action.numpy()

    def observe(self, action, reward, next_obs, terminated, truncated, skip, extras=None) -> None:
        if self.writer is not None:
            self.writer.add_outcome(
                torch.as_tensor(np.asarray(reward, dtype=np.float32)),
                torch.as_tensor(np.asarray(terminated, dtype=bool)),
                torch.as_tensor(np.asarray(truncated, dtype=bool)),
            )

    def update(self, wait: bool = False) -> None:
        if self.client is not None:
            self.client.update(wait)

    def state_dict(self) -> dict[str, Any]:
        writer = self.writer.state_dict() if self.writer is not None else None
        return dict(generator=self.generator.get_state(), state=self.state, first=self.first,
                    writer=writer)  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        device = getattr(self.policy, "device", "cpu")  # checkpoints load on the CPU
        self.first = state["first"]
        self.state = None if state["state"] is None else tuple(s.to(device) for s in state["state"])
        if self.writer is not None:
            self.writer.load_state_dict(state["writer"])
