"""The IMPALA learner: V-trace targets, the three loss terms, one optimiser step per batch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from rlherd import types as F
from rlherd.agents.impala.config import ImpalaConfig
from rlherd.agents.impala.networks import CoreState, ImpalaNet
from rlherd.agents.learning import NetworkLearner, adam, clip_grad_norm, rmsprop
from rlherd.losses.vtrace import (
    baseline_loss,
    entropy_loss,
    policy_gradient_loss,
    vtrace_from_logits,
)
from rlherd.replay.rollouts import core_state_of


def impala_loss(
    net: ImpalaNet, batch: dict[str, torch.Tensor], core_state: CoreState, config: ImpalaConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The IMPALA loss of one ``[T + 1, B]`` batch of rollouts, and its parts for logging."""
    first = torch.zeros_like(batch[F.RESET])
    first[1:] = batch[F.RESET][:-1]  # the state is zeroed after a final observation
    outputs, _ = net(F.obs_of(batch), first, core_state)
    logits, values = outputs[F.POLICY_LOGITS], outputs[F.BASELINE]

    rewards = batch[F.REWARD][:-1]
    if config.reward_clip is not None:
        rewards = rewards.clamp(-config.reward_clip, config.reward_clip)
    elif config.reward_tanh_scale is not None:
        rewards = torch.tanh(rewards / config.reward_tanh_scale)
    mask = ~batch[F.RESET][:-1]
    actions = batch[F.ACTION][:-1]
    vtrace = vtrace_from_logits(
        batch[F.POLICY_LOGITS][:-1],
        logits[:-1].detach(),
        actions,
        rewards,
        values.detach(),
        batch[F.TERMINATED][:-1],
        batch[F.TRUNCATED][:-1],
        mask,
        discount=config.discount,
        lambda_=config.vtrace_lambda,
        clip_rho_threshold=config.clip_rho_threshold,
        clip_pg_rho_threshold=config.clip_pg_rho_threshold,
    )
    pg = policy_gradient_loss(logits[:-1], actions, vtrace.pg_advantages, mask)
    baseline = config.baseline_cost * baseline_loss(values[:-1], vtrace.vs, mask)
    entropy = config.entropy_cost * entropy_loss(logits[:-1], mask)
    total = pg + baseline + entropy
    rho_sum, rows = (vtrace.log_rhos.exp() * mask).sum(), mask.sum()
    return total, dict(  # tensors, read by the recorder once per log interval
        total_loss=total.detach(),
        pg_loss=pg.detach(),
        baseline_loss=baseline.detach(),
        entropy_loss=entropy.detach(),
        mean_rho=torch.where(rows > 0, rho_sum / rows.clamp(min=1), 1.0).detach(),
    )


class ImpalaLearner(NetworkLearner):
    """One ``step()`` takes one ``[T + 1, B]`` batch of rollouts from ``dataset`` (with the
    recurrent state before row 0 as ``core_state.*``) and applies one optimiser update.

    The learning rate decays linearly with the agent steps consumed (``T * B`` per batch), as in
    TorchBeast; the schedule is a function of ``consumed_steps``, so it resumes exactly.
    """

    checkpointed = ("net", "optimizer", "consumed_steps")

    def __init__(
        self,
        net: ImpalaNet,
        config: ImpalaConfig,
        total_steps: int,
        dataset: Iterator[dict[str, torch.Tensor]],
    ):
        self.net = net
        self.config = config
        self.dataset = dataset
        self.total_steps = total_steps
        self.consumed_steps = 0
        self.num_steps = 0
        if config.optimizer == "rmsprop":
            self.optimizer = rmsprop(
                net.parameters(),
                config.learning_rate,
                config.rmsprop_alpha,
                config.rmsprop_eps,
                momentum=config.rmsprop_momentum,
            )
        elif config.optimizer == "adam":
            self.optimizer = adam(net.parameters(), config.learning_rate)
        else:
            raise ValueError(f"unknown optimizer {config.optimizer!r}; use 'rmsprop' or 'adam'")

    def learning_rate(self) -> float:
        if not self.config.lr_decay:
            return self.config.learning_rate
        return self.config.learning_rate * max(0.0, 1.0 - self.consumed_steps / self.total_steps)

    def learn(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        device = next(self.net.parameters()).device
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        core_state = core_state_of(batch)
        lr = self.learning_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss, metrics = impala_loss(self.net, batch, core_state, self.config)
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = clip_grad_norm(self.net.parameters(), self.config.grad_norm_clip)
        self.optimizer.step()
        T, B = batch[F.REWARD].shape[0] - 1, batch[F.REWARD].shape[1]
        self.consumed_steps += T * B
        self.num_steps += 1
        return dict(metrics, learning_rate=lr, grad_norm=grad_norm)
