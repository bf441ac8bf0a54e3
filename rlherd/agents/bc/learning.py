"""Behaviour cloning's learner: one Adam step on the clone loss per batch of the dataset's
transitions (:mod:`rlherd.losses.offline`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rlherd import types as F
from rlherd.agents.bc.config import BCConfig
from rlherd.agents.bc.networks import BCNetwork
from rlherd.agents.learning import NetworkLearner, adam
from rlherd.losses.offline import categorical_nll, gaussian_nll, mean_squared_error
from rlherd.replay.dataset import ReplaySample


def clone_loss(net: BCNetwork, obs, action, loss: str):
    """The loss of ``net``'s policy on the dataset's ``(obs, action)`` pairs."""
    if net.discrete:
        return categorical_nll(net(obs), action)
    mean, std = net(obs)
    target = net.from_env(action)
    return gaussian_nll(mean, std, target) if loss == "logp" else mean_squared_error(mean, target)


class BCLearner(NetworkLearner):
    checkpointed = ("net", "optimizer")

    def __init__(self, net: BCNetwork, config: BCConfig, dataset: Iterator[ReplaySample]):
        self.net, self.config, self.dataset = net, config, dataset
        self.optimizer = adam(net.parameters(), config.learning_rate)
        self.num_steps = 0

    def learn(self, sample: ReplaySample) -> dict[str, Any]:
        obs = F.obs_of(sample.data, "obs")
        loss = clone_loss(self.net, obs, sample.data["action"], self.config.loss)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.num_steps += 1
        return dict(total_loss=loss.detach())
