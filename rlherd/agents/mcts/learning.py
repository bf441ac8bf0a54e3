"""MCTS's learner (Acme's ``AZLearner``): the value by TD on replayed n-step transitions, the
policy towards the search policy the actor stored with each, and (``model=learned``) the
transition model on the first step of each (stored beside it by the actor)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from rlherd import types as F
from rlherd.agents.learning import NetworkLearner, adam
from rlherd.agents.mcts.config import MCTSConfig
from rlherd.agents.mcts.networks import MCTSNetworks
from rlherd.losses.search import search_policy_kl, transition_model_loss, value_td_loss
from rlherd.replay import ReplaySample


class MCTSLearner(NetworkLearner):
    """One ``step()``: one batch, one Adam update of the networks (and model) together."""

    checkpointed = ("net", "optimizer")

    def __init__(self, net: MCTSNetworks, config: MCTSConfig, dataset: Iterator[ReplaySample]):
        self.net, self.config, self.dataset = net, config, dataset
        self.optimizer = adam(net.parameters(), config.learning_rate)
        self.num_steps = 0

    def learn(self, sample: ReplaySample) -> dict[str, Any]:
        data = sample.data
        obs = F.obs_of(data, "obs")
        logits, value = self.net(obs)
        with torch.no_grad():
            _, next_value = self.net(F.obs_of(data, "next_obs"))
        value_loss = value_td_loss(value, data["reward"], data["discount"], next_value).mean()
        policy_loss = search_policy_kl(logits, data["search_policy"]).mean()
        loss = value_loss + policy_loss
        metrics = dict(value_loss=value_loss.detach(), policy_kl=policy_loss.detach())
        if self.net.model is not None:  # on each transition's first step
            predicted = self.net.model(obs, data["action"])
            continues = ~data["step_terminated"]
            model_loss = transition_model_loss(predicted, data["step_next_obs"],
                                               data["step_reward"], continues)  # fmt: skip
            loss = loss + model_loss
            metrics["model_loss"] = model_loss.detach()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.num_steps += 1
        return dict(loss=loss.detach(), **metrics)
