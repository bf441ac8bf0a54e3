"""MCTS acts by searching: :class:`MCTSPolicy` is the network the search consults (priors and
values), :class:`MCTSActor` searches from every environment it plays, acts by sampling the
root's visit counts, and writes transitions with the search policy as an extra."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlherd import types as F
from rlherd.agents.acting import FeedForwardPolicy, as_tensor, to_device
from rlherd.agents.mcts.models import LearnedModel, Simulator
from rlherd.agents.mcts.search import SearchSettings, search, visit_policy
from rlherd.core import VariableClient
from rlherd.networks.distributions import mask_logits
from rlherd.replay import BatchAdder


class MCTSPolicy(FeedForwardPolicy):
    """A :class:`~rlherd.core.Policy`: the network's prior logits and value for a batch of
    observations (its ``action``, the prior's argmax, is what acting without search would do).
    ``greedy`` tells an actor without an adder (an evaluation) to act on the most visited
    action."""

    @torch.no_grad()
    def __call__(self, obs, first, state, generator):
        obs = to_device(obs, self.device)
        logits, value = self.net(obs)
        action = mask_logits(logits, F.action_mask(obs)).argmax(-1)
        return {F.ACTION: action, "logits": logits, "value": value}, state

    @torch.inference_mode()
    def prior_and_value(self, obs: Any) -> tuple[np.ndarray, np.ndarray]:
        """The search's call: ``(logits [K, A], value [K])`` as arrays, and nothing else. A
        search makes one per simulation; what ``__call__`` adds (the action, autograd's
        bookkeeping) was about a quarter of such a call's time for one tree."""
        logits, value = self.net(to_device(F.map_obs(as_tensor, obs), self.device))
        return logits.float().cpu().numpy(), value.float().cpu().numpy()


class MCTSActor:
    """An :class:`~rlherd.core.Actor` that searches before each step of every environment whose
    episode goes on, then samples the root's ``visits ** (1 / temperature)``. The search's own
    visit distribution (temperature 1) is written with the transition as ``search_policy``, the
    learner's policy target. Its random draws (ties, root noise, sampling) come from ``seed``.

    The environment loop hands it the environments it plays (``bind_environments``), which a
    simulator model copies. With ``record_steps`` (a learned model) each transition also carries
    its first step (``step_next_obs``, ``step_reward``, ``step_terminated``), which the model
    learns from whatever the n of the value's n-step returns."""

    def __init__(
        self,
        policy: MCTSPolicy,
        model: Simulator | LearnedModel,
        settings: SearchSettings,
        temperature: float,
        adder: BatchAdder | None,
        seed: int,
        num_actions: int,
        client: VariableClient | None = None,
        record_steps: bool = False,
    ):
        self.policy, self.model, self.settings = policy, model, settings
        self.num_actions, self.record_steps = num_actions, record_steps
        self.temperature, self.adder, self.client = temperature, adder, client
        self.rng = np.random.default_rng(seed)
        self.ended: np.ndarray | None = None  # this env's last step ended its episode
        self.search_policy: np.ndarray | None = None

    def bind_environments(self, envs: list[gym.Env] | None) -> None:
        self.model.bind(envs)

    def select_action(self, obs: np.ndarray) -> np.ndarray:
        obs, n = F.map_obs(np.asarray, obs), F.obs_len(obs)
        if self.ended is None:
            self.ended = np.zeros(n, dtype=bool)
        live = np.flatnonzero(~self.ended)  # an ended env's next step only resets it
        action = np.zeros(n, dtype=np.int64)
        self.search_policy = np.full((n, self.num_actions), 1 / self.num_actions, np.float32)
        if len(live):
            obs_live = F.map_obs(lambda x: x[live], obs)
            roots, legal = self.model.roots(live, obs_live)
            tree = search(roots, obs_live, legal, self.model, self.policy.prior_and_value,
                          self.settings, self.rng)  # fmt: skip
            self.model.after_search(roots)
            self.search_policy[live] = visit_policy(tree, 1.0)
            acting = visit_policy(tree, self.temperature)
            draws = self.rng.random((len(live), 1))
            chosen = (acting.cumsum(-1) < draws).sum(-1)
            action[live] = np.minimum(chosen, self.num_actions - 1)
        return action

    def observe_first(self, obs: np.ndarray, envs: np.ndarray) -> None:
        if self.ended is not None:
            self.ended[np.asarray(envs, dtype=bool)] = False
        if self.adder is not None:
            self.adder.add_first(obs, envs)

    def observe(self, action, reward, next_obs, terminated, truncated, skip, extras=None) -> None:
        if self.adder is not None:
            extras = {**(extras or {}), "search_policy": self.search_policy}
            if self.record_steps:
                extras.update(step_next_obs=np.asarray(next_obs), step_terminated=terminated,
                              step_reward=np.asarray(reward, np.float32))  # fmt: skip
            self.adder.add(action, reward, next_obs, terminated, truncated, skip, extras)
        self.ended = np.asarray(terminated, bool) | np.asarray(truncated, bool)

    def update(self, wait: bool = False) -> None:
        if self.client is not None:
            self.client.update(wait)

    def state_dict(self) -> dict[str, Any]:
        adder = self.adder.state_dict() if self.adder is not None else None
        return dict(rng=self.rng.bit_generator.state, ended=self.ended, adder=adder,
                    search_policy=self.search_policy)  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.ended, self.search_policy = state["ended"], state["search_policy"]
        if self.adder is not None:
            self.adder.load_state_dict(state["adder"])
