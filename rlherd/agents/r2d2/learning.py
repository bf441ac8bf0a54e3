"""The R2D2 learner: burn-in, n-step double-Q targets under the value rescaling h, a loss
summed over each sequence and weighted for prioritised sampling, and the sequences' new
priorities (acme/agents/jax/r2d2/learning.py)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch

from rlherd import types as F
from rlherd.agents.learning import NetworkLearner, adam, clip_grad_norm, copy_parameters
from rlherd.agents.r2d2.acting import STATE_KEYS
from rlherd.agents.r2d2.config import R2D2Config
from rlherd.losses.td import (
    greedy_action,
    n_step_sequence_returns,
    sequence_priorities,
    signed_hyperbolic,
    signed_parabolic,
)
from rlherd.replay import ReplaySample, Table


def r2d2_loss(
    net: torch.nn.Module,
    target_net: torch.nn.Module,
    data: dict[str, torch.Tensor],
    weights: torch.Tensor | None,
    config: R2D2Config,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The loss of a batch of ``[B, T]`` sequences, each sequence's priority, and its TD errors
    ``[T, B]`` (0 on rows not learned from).

    Both networks start from the state stored with the sequence. The first ``burn_in`` rows
    only warm that state up: no loss on them, and no gradient through the state they pass on.
    The exception is a sequence that starts its episode, whose stored state is exact (zero):
    nothing needs burning in, so all its rows are learned from (otherwise the first
    ``burn_in`` steps of every episode would never be, which loses short episodes, e.g.
    DeepSea's, entirely; Acme does lose them). A row is learned from if it is real (``mask``),
    had an action taken (not an episode's final observation) and is not the sequence's last
    (which only bootstraps). The loss is ``0.5 td^2`` summed over a sequence, then averaged over
    the batch with the importance weights, as Acme has it."""
    per_sequence = (*STATE_KEYS, "demonstration")
    seq = {k: v.transpose(0, 1) for k, v in data.items() if k not in per_sequence}
    state = tuple(data[k].transpose(0, 1).contiguous() for k in STATE_KEYS)
    burn, obs, starts = config.burn_in, F.obs_of(seq, "obs"), seq["first"][0]
    with torch.no_grad():
        q_target, _ = target_net.unroll(obs, state)
    if burn:
        q_burn, burned = net.unroll(F.map_obs(lambda x: x[:burn], obs), state)
        keep = starts.float()[None, :, None]  # gradients flow on from the burn-in only here
        burned = tuple(s * keep + s.detach() * (1 - keep) for s in burned)
        q = torch.cat([q_burn, net.unroll(F.map_obs(lambda x: x[burn:], obs), burned)[0]])
    else:
        q, _ = net.unroll(obs, state)

    # Each row's bootstrap action: the online network's best among those legal there.
    values = q_target.gather(-1, greedy_action(q.detach(), F.action_mask(obs))[..., None])[..., 0]
    if config.value_rescaling:
        values = signed_parabolic(values, config.value_rescaling_eps)
    ended = seq["terminated"] | seq["truncated"]
    discounts = config.discount * (~seq["terminated"]).float()
    returns = n_step_sequence_returns(seq["reward"], discounts, ended, values, config.n_step)
    if config.value_rescaling:
        returns = signed_hyperbolic(returns, config.value_rescaling_eps)
    q_taken = q.gather(-1, seq["action"].long()[..., None])[..., 0]
    valid = seq["mask"] & ~seq["reset"]
    valid[:burn] &= starts
    valid[-1] = False
    td = (returns - q_taken) * valid
    loss = 0.5 * td.square().sum(0)
    loss = loss.mean() if weights is None else (weights * loss).mean()
    td = td.detach()
    return loss, sequence_priorities(td.abs(), valid, config.max_priority_weight), td


class R2D2Learner(NetworkLearner):
    """One ``step()``: one batch of sequences, one Adam update, the sequences' new priorities,
    and a target copy every ``target_update_period`` steps."""

    checkpointed = ("net", "target_net", "optimizer")

    def __init__(
        self,
        net: torch.nn.Module,
        config: R2D2Config,
        dataset: Iterator[ReplaySample] | None,
        table: Table | None,
    ):
        self.net, self.config, self.dataset, self.table = net, config, dataset, table
        self.target_net = copy.deepcopy(net)
        self.target_net.requires_grad_(False)
        if dataset is not None:
            dataset.importance_beta = config.importance_sampling_exponent
        self.params = list(net.parameters())
        self.optimizer = adam(self.params, config.learning_rate, config.adam_eps)
        self.num_steps = 0

    def learn(self, sample: ReplaySample) -> dict[str, Any]:
        loss, priorities, td = r2d2_loss(
            self.net, self.target_net, sample.data, sample.weights, self.config
        )
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = clip_grad_norm(self.params, self.config.grad_norm_clip)
        self.optimizer.step()
        self.num_steps += 1
        if self.num_steps % self.config.target_update_period == 0:
            copy_parameters(self.target_net, self.net)
        if self.table is not None:
            self.write_priorities(sample.info.keys, priorities)
        return dict(loss=loss.detach(), td_abs_max=td.abs().max(), grad_norm=grad_norm,
                    priority_mean=priorities.mean())  # fmt: skip
