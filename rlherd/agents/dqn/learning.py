"""The DQN learner: (double) n-step Q-learning with a Huber loss, importance weights and priority
updates for prioritised replay, and a periodically copied target network."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

import torch

from rlherd import types as F
from rlherd.agents.dqn.config import DQNConfig
from rlherd.agents.learning import (
    CenteredRMSprop,
    CompiledStep,
    NetworkLearner,
    adam,
    clip_grad_norm,
    copy_parameters,
    flatten_parameters,
)
from rlherd.losses.td import double_q_learning_td, huber, large_margin, q_learning_td
from rlherd.replay import ReplaySample, Table


def dqn_loss(
    net: torch.nn.Module,
    target_net: torch.nn.Module,
    data: dict[str, torch.Tensor],
    weights: torch.Tensor | None,
    config: DQNConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (importance-weighted) Huber loss of a batch of n-step transitions, and its TD errors.

    With double Q the online network selects the bootstrap action at ``next_obs`` in a pass of
    its own without gradients: one pass over ``obs`` and ``next_obs`` together, sliced, costs
    fewer calls but back-propagates through twice the rows (5% slower on the ``classic``
    CartPole step, benchmarks/learner_step.py). With ``margin_loss_weight`` and demonstrations in
    the batch (``data["demonstration"]``), DQfD's large-margin loss, averaged over the
    demonstrated transitions, is added."""
    obs, next_obs = F.obs_of(data, "obs"), F.obs_of(data, "next_obs")
    q_tm1 = net(obs)
    with torch.no_grad():
        q_t_value = target_net(next_obs)
        q_t_selector = net(next_obs) if config.double_q else None
    args = (q_tm1, data["action"], data["reward"], data["discount"], q_t_value)
    mask_t = F.action_mask(next_obs)  # bootstrap from the legal actions only
    if config.double_q:
        td = double_q_learning_td(*args, q_t_selector, mask_t)
    else:
        td = q_learning_td(*args, mask_t)
    loss = huber(td, config.huber_delta)
    loss = loss.mean() if weights is None else (weights * loss).mean()
    if config.margin_loss_weight and "demonstration" in data:
        demo = data["demonstration"].float()
        mask = F.action_mask(obs)
        margin = (large_margin(q_tm1, data["action"], config.margin, mask) * demo).sum()
        loss = loss + config.margin_loss_weight * margin / demo.sum().clamp(min=1)
    return loss, td.detach()


class DQNLearner(NetworkLearner):
    """One ``step()``: one batch from ``dataset``, one optimiser update, new priorities.

    The importance exponent beta rises linearly from ``config.importance_beta`` to 1 over the
    learner steps the run will take (``total_steps * samples_per_insert / batch_size``).
    """

    checkpointed = ("net", "target_net", "optimizer")

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
        ratio = config.replay_ratio
        # With no rate limit (inf) the run's learner steps are open: beta keeps its start, which
        # only the log reads (prioritised replay refuses inf, DQNConfig).
        self.expected_steps = (
            math.inf if math.isinf(ratio) else max(1, int(total_steps * ratio / config.batch_size))
        )
        if dataset is not None and config.prioritized:
            dataset.importance_beta = self.importance_beta  # the dataset weighs with our schedule
        self.num_steps = 0
        # One tensor under all parameters: zeroing and the optimiser make one call each (the
        # target, copied above, keeps its own layout). The clip sums per-parameter norms, as
        # before: one norm of the flat gradient rounds differently, and RL Zoo's CartPole
        # preset then ended at greedy 102 and 208 on seeds 2 and 3 (500 with these numbers).
        self.flat = flatten_parameters(net)
        self.params = list(net.parameters())  # views of self.flat
        if config.optimizer == "adam":
            self.optimizer = adam([self.flat], config.learning_rate, config.adam_eps)
        else:
            self.optimizer = CenteredRMSprop(
                [self.flat], config.learning_rate, config.rmsprop_alpha, config.rmsprop_eps
            )
        self.compiled = None
        if config.compile_step:
            self.compiled = CompiledStep(
                lambda data, weights: dqn_loss(self.net, self.target_net, data, weights, config),
                [self.net, self.target_net], self.flat, self.optimizer, config.grad_norm_clip,
            )  # fmt: skip

    def importance_beta(self) -> float:
        b0 = self.config.importance_beta
        return b0 + (1.0 - b0) * min(1.0, self.num_steps / self.expected_steps)

    def learn(self, sample: ReplaySample) -> dict[str, Any]:
        """One update; its metrics stay tensors (the recorder reads them once per log
        interval), except what prioritised replay needs now: the TD errors, as priorities."""
        if self.compiled is not None:
            loss, td, grad_norm = self.compiled(sample.data, sample.weights)
        else:
            loss, td = dqn_loss(self.net, self.target_net, sample.data, sample.weights,
                                self.config)  # fmt: skip
            self.flat.grad.zero_()
            loss.backward()
            grad_norm = clip_grad_norm(self.params, self.config.grad_norm_clip)
            self.optimizer.step()
        self.num_steps += 1
        if self.table is not None:
            self.net.experience.fill_(self.table.insert_count)
        if self.num_steps % self.config.target_update_period == 0:
            copy_parameters(self.target_net, self.net)
        if self.config.prioritized and self.table is not None:
            self.write_priorities(sample.info.keys, td.abs().double() + self.config.priority_eps)
        return dict(
            loss=loss.detach(),
            td_abs_mean=td.abs().mean(),
            grad_norm=grad_norm,
            importance_beta=self.importance_beta(),
        )
