"""The DQN learner: (double) n-step Q-learning with a Huber loss, importance weights and priority
updates for prioritised replay, and a periodically copied target network."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from rlherd.agents.dqn.config import DQNConfig
from rlherd.losses.td import double_q_learning_td, huber, q_learning_td
from rlherd.replay import ReplaySample, Table
from rlherd.run.config import TrainingDiverged


def dqn_loss(
    net: torch.nn.Module,
    target_net: torch.nn.Module,
    data: dict[str, torch.Tensor],
    weights: torch.Tensor,
    config: DQNConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weighted Huber loss of a batch of n-step transitions, and its TD errors."""
    q_tm1 = net(data["obs"])
    with torch.no_grad():
        q_t_value = target_net(data["next_obs"])
        q_t_selector = net(data["next_obs"]) if config.double_q else None
    args = (q_tm1, data["action"], data["reward"], data["discount"], q_t_value)
    td = double_q_learning_td(*args, q_t_selector) if config.double_q else q_learning_td(*args)
    return (weights * huber(td, config.huber_delta)).mean(), td.detach()


class DQNLearner:
    """One ``step()``: one batch from ``dataset``, one optimiser update, new priorities.

    The importance exponent beta rises linearly from ``config.importance_beta`` to 1 over the
    learner steps the run will take (``total_steps * samples_per_insert / batch_size``).
    """

    def __init__(
        self,
        net: torch.nn.Module,
        config: DQNConfig,
        total_steps: int,
        dataset: Iterator[ReplaySample] | None,
        table: Table | None,
    ):
        self.net, self.config, self.dataset, self.table = net, config, dataset, table
        self.target_net = copy.deepcopy(net)
        self.target_net.requires_grad_(False)
        self.expected_steps = max(
            1, int(total_steps * config.samples_per_insert / config.batch_size)
        )
        if dataset is not None and config.prioritized:
            dataset.importance_beta = self.importance_beta  # the dataset weighs with our schedule
        self.num_steps = 0
        if config.optimizer == "adam":
            self.optimizer = torch.optim.Adam(
                net.parameters(), lr=config.learning_rate, eps=config.adam_eps, foreach=True
            )
        else:
            self.optimizer = torch.optim.RMSprop(
                net.parameters(),
                lr=config.learning_rate,
                alpha=config.rmsprop_alpha,
                eps=config.rmsprop_eps,
                centered=True,
            )

    def importance_beta(self) -> float:
        b0 = self.config.importance_beta
        return b0 + (1.0 - b0) * min(1.0, self.num_steps / self.expected_steps)

    def learn(self, sample: ReplaySample) -> dict[str, float]:
        info = sample.info
        weights = sample.weights
        if weights is None:  # uniform replay
            weights = torch.ones(len(info.keys), device=next(self.net.parameters()).device)
        loss, td = dqn_loss(self.net, self.target_net, sample.data, weights, self.config)
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.net.parameters(), self.config.grad_norm_clip
        )
        self.optimizer.step()
        self.num_steps += 1
        if self.table is not None:
            self.net.experience.fill_(self.table.insert_count)
        if self.num_steps % self.config.target_update_period == 0:
            self.target_net.load_state_dict(self.net.state_dict())
        if not torch.isfinite(td).all():  # before the table takes them as priorities
            raise TrainingDiverged(
                f"learner step {self.num_steps}: TD errors are not finite; {TrainingDiverged.HINT}"
            )
        if self.config.prioritized and self.table is not None:
            priorities = np.abs(td.cpu().numpy()).astype(np.float64) + self.config.priority_eps
            self.table.update_priorities(info.keys, priorities)
        return dict(
            loss=loss.item(),
            td_abs_mean=td.abs().mean().item(),
            grad_norm=grad_norm.item(),
            importance_beta=self.importance_beta(),
        )

    def step(self) -> dict[str, float]:
        return self.learn(next(self.dataset))

    def get_variables(self, names: list[str]) -> list[dict[str, Any]]:
        return [self.net.state_dict() for _ in names]

    def variables_version(self) -> int:
        return self.num_steps

    def state_dict(self) -> dict[str, Any]:
        return dict(
            net=self.net.state_dict(),
            target_net=self.target_net.state_dict(),
            optimizer=self.optimizer.state_dict(),
            num_steps=self.num_steps,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.target_net.load_state_dict(state["target_net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.num_steps = state["num_steps"]
