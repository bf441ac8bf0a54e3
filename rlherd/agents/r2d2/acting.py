"""R2D2 acts with :class:`R2D2Policy` (the recurrent network's greedy action and its next
state) and explores in :class:`R2D2Actor`: epsilon-greedy, each episode with an epsilon drawn
from a fixed set, writing sequences whose first row carries the recurrent state it began with."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlherd import types as F
from rlherd.agents.acting import as_tensor, explore
from rlherd.core import VariableClient
from rlherd.losses.td import greedy_action
from rlherd.replay import BatchAdder

STATE_KEYS = ("core_h", "core_c")  # the recurrent state, stored once per replay sequence


def epsilon_set(num_epsilons: int) -> np.ndarray:
    """Acme's R2D2 exploration: ``num_epsilons`` values log-spaced from 0.1 to 0.001, one drawn
    for each episode (acme/agents/jax/r2d2/actor.py). Acme draws per episode where Ape-X and
    the R2D2 paper fix one per actor (``0.4 ** (1 + 7 i / (N - 1))``); drawing needs no actor
    index, so it is the same code on every runtime and any number of actors."""
    return np.logspace(-1, -3, num_epsilons)


class R2D2Policy:
    """A recurrent :class:`~rlherd.core.Policy`: zeroes the state of rows that begin an episode,
    steps the LSTM once, and returns the greedy action with the Q-values. ``greedy`` tells an
    actor without an adder (an evaluation) whether to explore at all."""

    def __init__(self, net: torch.nn.Module, greedy: bool = False):
        self.net, self.greedy = net, greedy
        self.device = next(net.parameters()).device

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return self.net.initial_state(batch_size)

    @torch.no_grad()
    def __call__(self, obs, first, state, generator):
        keep = (~first.to(self.device)).float()[None, :, None]
        state = tuple(s.to(self.device) * keep for s in state)
        obs = F.map_obs(lambda x: x.to(self.device)[None], obs)
        q, state = self.net.unroll(obs, state)
        mask = F.action_mask(obs)
        action = greedy_action(q[0], None if mask is None else mask[0])
        return {F.ACTION: action, "q_values": q[0]}, state


class R2D2Actor:
    """An :class:`~rlherd.core.Actor` over a batch of environments: keeps each one's recurrent
    state (zeroed when its episode begins) and epsilon (drawn from ``epsilons`` when it begins;
    a number: always that one), and with an ``adder`` writes every step with the state the
    policy had before reading it, which the sequence adder keeps from each sequence's first
    row."""

    def __init__(
        self,
        policy: R2D2Policy,
        adder: BatchAdder | None,
        epsilons: np.ndarray | float,
        seed: int,
        client: VariableClient | None = None,
    ):
        self.policy, self.adder, self.client = policy, adder, client
        self.epsilons = np.atleast_1d(np.asarray(epsilons, dtype=np.float64))
        self.rng = np.random.default_rng(seed)
        self.state: tuple[torch.Tensor, ...] | None = None
        self.state_before: tuple[torch.Tensor, ...] = ()
        self.first = np.zeros(0, dtype=bool)
        self.epsilon = np.zeros(0)

    def observe_first(self, obs: np.ndarray, envs: np.ndarray) -> None:
        envs = np.asarray(envs, dtype=bool)
        if self.state is None:
            self.state = tuple(s.cpu() for s in self.policy.initial_state(len(envs)))
            self.first, self.epsilon = np.zeros(len(envs), dtype=bool), np.zeros(len(envs))
        keep = torch.as_tensor(~envs, dtype=torch.float32)[None, :, None]
        self.state = tuple(s * keep for s in self.state)
        self.first |= envs
        self.epsilon[envs] = self.rng.choice(self.epsilons, size=int(envs.sum()))
        if self.adder is not None:
            self.adder.add_first(obs, envs)

    def select_action(self, obs: np.ndarray) -> np.ndarray:
        tensors = F.map_obs(as_tensor, obs)
        outputs, state = self.policy(tensors, torch.as_tensor(self.first), self.state, None)
        self.state_before, self.state = self.state, tuple(s.cpu() for s in state)
        self.first[:] = False
        return explore(self.rng, outputs[F.ACTION].cpu().numpy(), self.epsilon, obs,
                       outputs["q_values"].shape[-1])  # fmt: skip

    def observe(self, action, reward, next_obs, terminated, truncated, skip, extras=None) -> None:
        if self.adder is None:
            return
        before = zip(STATE_KEYS, self.state_before, strict=True)
        state = {k: s.transpose(0, 1).numpy() for k, s in before}  # batch first, to split
        self.adder.add(action, reward, next_obs, terminated, truncated, skip,
                       {**(extras or {}), **state})  # fmt: skip

    def update(self, wait: bool = False) -> None:
        if self.client is not None:
            self.client.update(wait)

    def state_dict(self) -> dict[str, Any]:
        adder = self.adder.state_dict() if self.adder is not None else None
        return dict(rng=self.rng.bit_generator.state, state=self.state, first=self.first,
                    epsilon=self.epsilon, adder=adder)  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.state, self.first, self.epsilon = state["state"], state["first"], state["epsilon"]
        if self.adder is not None:
            self.adder.load_state_dict(state["adder"])
