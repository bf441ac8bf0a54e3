"""The PPO learner: GAE on a rollout, then epochs of minibatch updates on its valid rows.

One ``step()`` consumes one ``[T + 1, B]`` batch of rollouts from its dataset. With
``normalize_obs`` it first adds the batch's observations to the network's streaming statistics
(learner state, as in Acme: actors receive them with the parameters). Autoreset rows (``reset[t]``)
are not transitions; they are dropped before anything is computed, so advantage normalisation,
the losses and the metrics see only real steps. Truncated episodes bootstrap from the value of
their final observation (GAE handles it); terminated ones do not.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from rlherd import types as F
from rlherd.agents.learning import NetworkLearner, clip_grad_norm
from rlherd.agents.ppo.config import PPOConfig
from rlherd.agents.ppo.networks import PPONet
from rlherd.losses.gae import gae
from rlherd.losses.ppo import (
    adapt_kl_beta,
    clipped_surrogate_loss,
    kl_penalty_loss,
    normalize_advantages,
    policy_gradient_loss,
    value_loss,
)

_ROW_FIELDS = (F.ACTION, F.BEHAVIOUR_LOG_PROB, F.POLICY_PARAMS, F.BASELINE)


def flatten_valid(rollout: dict[str, torch.Tensor], config: PPOConfig) -> dict[str, torch.Tensor]:
    """Advantages and returns of a rollout, and its transitions as flat rows (valid ones only)."""
    mask = ~rollout[F.RESET][:-1]
    advantages, returns = gae(
        rollout[F.REWARD][:-1],
        rollout[F.BASELINE],
        rollout[F.TERMINATED][:-1],
        rollout[F.TRUNCATED][:-1],
        mask,
        discount=config.discount,
        lambda_=config.gae_lambda,
    )
    valid = mask.flatten()
    fields = [*F.obs_fields(F.OBS, F.obs_of(rollout)), *_ROW_FIELDS]
    rows = {k: rollout[k][:-1].flatten(0, 1)[valid] for k in fields}
    rows["advantage"] = advantages.flatten()[valid]
    rows["return"] = returns.flatten()[valid]
    return rows


class PPOLearner(NetworkLearner):
    """PPO-clip, BatchPPO's KL-penalty objective or A2C (``config.objective``), with one Adam for
    a shared network or one each for policy and value (``value_learning_rate``).

    The learning rate (and with ``anneal_clip`` the clip range) fall linearly with the agent
    steps consumed, so the schedule resumes exactly. BatchPPO's penalty weight ``beta`` adapts
    once per update from the mean KL between the behaviour policy and the updated one.
    """

    checkpointed = ("net", "optimizer", "consumed_steps", "beta")

    def __init__(
        self,
        net: PPONet,
        config: PPOConfig,
        total_steps: int,
        dataset: Iterator[dict[str, torch.Tensor]],
    ):
        self.net, self.config, self.dataset, self.total_steps = net, config, dataset, total_steps
        self.consumed_steps = 0
        self.num_steps = 0
        self.beta = config.kl_init_beta
        self.entropy_cost = config.entropy_cost
        if config.value_learning_rate is None:
            groups = [dict(params=list(net.parameters()), lr=config.learning_rate)]
            self.base_lrs = [config.learning_rate]
        else:
            groups = [
                dict(params=list(net.policy_parameters()), lr=config.learning_rate),
                dict(params=list(net.value_parameters()), lr=config.value_learning_rate),
            ]
            self.base_lrs = [config.learning_rate, config.value_learning_rate]
        # Adam keeps moments per parameter, so one Adam with a group per network is exactly
        # "separate Adam optimisers" (BatchPPO) while keeping one state dict.
        # Fused Adam: one kernel for every parameter (a quarter faster for small MLPs on CPU).
        self.optimizer = torch.optim.Adam(groups, eps=config.adam_eps, fused=True)

    def progress_remaining(self) -> float:
        return max(0.0, 1.0 - self.consumed_steps / self.total_steps)

    def learn(self, rollout: dict[str, torch.Tensor]) -> dict[str, Any]:
        c = self.config
        device = next(self.net.parameters()).device
        T, B = rollout[F.REWARD].shape[0] - 1, rollout[F.REWARD].shape[1]
        rows = {k: v.to(device) for k, v in flatten_valid(rollout, c).items()}
        if self.net.obs_norm is not None:
            self.net.obs_norm.update(rows[F.OBS])  # an array observation's
        frac = self.progress_remaining()
        lr_scale = frac if c.lr_anneal else 1.0
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * lr_scale
        clip = c.clip * frac if c.anneal_clip else c.clip
        self.entropy_cost = c.entropy_cost
        if c.entropy_cost_final is not None:
            self.entropy_cost = (
                c.entropy_cost_final + (c.entropy_cost - c.entropy_cost_final) * frac
            )

        n = rows["advantage"].shape[0]
        size = max(1, math.ceil(n / c.minibatches))
        sums: dict[str, torch.Tensor] = {}
        updates = 0
        for _ in range(c.epochs if n else 0):
            for idx in torch.randperm(n, device=device).split(size):
                metrics = self._update({k: v[idx] for k, v in rows.items()}, clip)
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                updates += 1
        out = {k: v / updates for k, v in sums.items()}
        with torch.no_grad():
            obs, m = F.obs_of(rows), c.max_rows_per_pass
            chunks = [self.net(F.map_obs(lambda x, i=i: x[i : i + m], obs)) for i in range(0, n, m)]
            params = torch.cat([p for p, _ in chunks]) if chunks else rows[F.POLICY_PARAMS]
            values = torch.cat([v for _, v in chunks]) if chunks else rows["return"]
            kl = self.net.dist.kl(rows[F.POLICY_PARAMS], params).mean() if n else torch.zeros(())
            explained = torch.zeros(())
            if n > 1:
                var = rows["return"].var()
                explained = torch.where(var > 0, 1.0 - (rows["return"] - values).var() / var, 0.0)
        if c.objective == "kl":
            out["kl_beta"] = self.beta  # the weight this update used
            self.beta = adapt_kl_beta(self.beta, kl.item(), c.kl_target)
        self.consumed_steps += T * B
        self.num_steps += 1
        return dict(
            out,
            kl=kl,
            explained_variance=explained,
            learning_rate=self.optimizer.param_groups[0]["lr"],
            clip=clip,
            entropy_cost=self.entropy_cost,
            valid_rows=n,
        )

    def _update(self, mb: dict[str, torch.Tensor], clip: float) -> dict[str, torch.Tensor]:
        """One optimiser step on a minibatch. Minibatches above ``max_rows_per_pass`` rows are
        run in chunks whose gradients add up to the whole minibatch's (every loss term is a
        mean over rows, weighted here by the chunk's share), so memory stays bounded."""
        c = self.config
        if c.normalize_advantages:  # over the whole minibatch, before any chunking
            mb = dict(mb, advantage=normalize_advantages(mb["advantage"]))
        n = mb["advantage"].shape[0]
        self.optimizer.zero_grad()
        totals: dict[str, torch.Tensor] = {}
        for idx in torch.arange(n, device=mb["advantage"].device).split(c.max_rows_per_pass):
            weight = len(idx) / n
            loss, metrics = self._loss({k: v[idx] for k, v in mb.items()}, clip)
            (loss * weight).backward()
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + v * weight
        if c.max_grad_norm is not None:
            clip_grad_norm(self.net.parameters(), c.max_grad_norm)
        self.optimizer.step()
        return totals

    def _loss(self, mb: dict[str, torch.Tensor], clip: float) -> tuple[torch.Tensor, dict]:
        c, dist = self.config, self.net.dist
        params, values = self.net(F.obs_of(mb))
        log_prob = dist.log_prob(params, mb[F.ACTION])
        advantages = mb["advantage"]
        clipped = clipped_surrogate_loss(log_prob, mb[F.BEHAVIOUR_LOG_PROB], advantages, clip)
        if c.objective == "clip":
            policy_loss = clipped.loss
        elif c.objective == "a2c":
            policy_loss = policy_gradient_loss(log_prob, advantages)
        else:
            policy_loss = kl_penalty_loss(
                log_prob,
                mb[F.BEHAVIOUR_LOG_PROB],
                advantages,
                dist.kl(mb[F.POLICY_PARAMS], params),
                self.beta,
                c.kl_target,
                c.kl_cutoff_factor,
                c.kl_cutoff_coef,
            )
        entropy = dist.entropy(params).mean()
        v_loss = value_loss(values, mb["return"], mb[F.BASELINE], c.value_clip)
        loss = policy_loss - self.entropy_cost * entropy + c.value_cost * v_loss
        return loss, dict(  # tensors, read by the recorder once per log interval
            policy_loss=policy_loss.detach(),
            value_loss=v_loss.detach(),
            entropy=entropy.detach(),
            approx_kl=clipped.approx_kl.detach(),
            clip_fraction=clipped.clip_fraction.detach(),
        )
