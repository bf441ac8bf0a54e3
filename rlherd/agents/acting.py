"""The actors agents share: act with a policy, record through a rollout writer or an adder.

:class:`RolloutActor` (on-policy agents) writes rows through a rollout writer, which decides
where its rollouts go (see :mod:`rlherd.replay.rollouts`); :class:`TransitionActor` (replay
agents whose policy explores on its own: DDPG, D4PG, TD3, SAC, MPO) writes transitions through
an adder.
Both are :class:`~rlherd.core.Actor` s, so the environment loop drives them in every host runtime
alike. Parameters reach them only through their variable clients.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlherd import types as F
from rlherd.core import Policy, VariableClient, VariableSource
from rlherd.networks.distributions import mask_logits
from rlherd.replay import BatchAdder
from rlherd.replay.rollouts import RolloutWriter


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A batch of environments' arrays as a tensor (sharing memory where it can)."""
    return torch.as_tensor(np.asarray(array))


def to_device(obs, device: torch.device):
    """An observation (a tensor or a dict of them) on ``device``."""
    return F.map_obs(lambda x: x.to(device), obs)


def explore(
    rng: np.random.Generator, greedy: np.ndarray, epsilon, obs, num_actions: int
) -> np.ndarray:
    """Epsilon-greedy: each row's greedy action, or with probability ``epsilon`` (a number or
    one per row) an action drawn uniformly from the legal ones (all, without a mask)."""
    rows = len(greedy)
    explore_ = rng.random(rows) < epsilon
    mask = F.action_mask(obs)
    if mask is None:
        random = rng.integers(num_actions, size=rows)
    else:  # the k-th legal action of each row, k uniform below the row's count of them
        legal = np.asarray(mask).astype(bool)
        k = np.floor(rng.random(rows) * legal.sum(-1))
        random = (legal.cumsum(-1) <= k[:, None]).sum(-1).clip(max=num_actions - 1)
    return np.where(explore_, random, greedy)


class FeedForwardPolicy:
    """What the feed-forward :class:`~rlherd.core.Policy` s share: the network they call, its
    device, no recurrent state, and ``greedy`` (an evaluation's: act without exploring)."""

    def __init__(self, net: torch.nn.Module, greedy: bool = False):
        self.net, self.greedy = net, greedy
        self.device = next(net.parameters()).device

    def initial_state(self, batch_size: int) -> tuple:
        return ()


class CategoricalPolicy(FeedForwardPolicy):
    """A :class:`~rlherd.core.Policy` over a network's scores of each discrete action (BC's
    logits, CQL's Q-values): the best action when ``greedy`` (evaluation), else a sample of
    their softmax from the caller's generator (``rlherd eval --sample``)."""

    @torch.no_grad()
    def __call__(self, obs, first, state, generator):
        obs = to_device(obs, self.device)
        scores = mask_logits(self.net(obs), F.action_mask(obs))  # legal actions only
        if self.greedy:
            return {F.ACTION: scores.argmax(-1)}, state
        action = torch.multinomial(scores.softmax(-1), 1, generator=generator)[:, 0]
        return {F.ACTION: action}, state


class GaussianSamplingPolicy(FeedForwardPolicy):
    """A :class:`~rlherd.core.Policy` over a network whose ``policy(obs)`` gives a diagonal
    Gaussian's ``(mean, std)`` in the canonical box and whose ``to_env`` rescales from it (MPO,
    DMPO, CRR, continuous BC): ``mean + std * N(0, 1)`` from the caller's generator, clipped to
    the box and rescaled to the environment's bounds; ``greedy`` (evaluation) acts with the
    mean."""

    @torch.no_grad()
    def __call__(self, obs, first, state, generator):
        mean, std = self.net.policy(to_device(obs, self.device))
        action = mean
        if not self.greedy:
            action = mean + std * torch.randn(mean.shape, generator=generator, device=self.device)
        return {F.ACTION: self.net.to_env(action)}, state


class WarmUpPolicy(FeedForwardPolicy):
    """What SAC's and TD3's policies share: with ``warm_up``, they act uniformly at random in
    the action box until their network's ``learning`` flag says the learner has taken its first
    step (:class:`~rlherd.networks.continuous.TwinCritics`), as the reference code fills replay
    with random actions before learning starts. The flag travels with the parameters, so it
    holds for every actor of every runtime (poly's central inference included), and a resumed
    run or a restarted actor, whose learner has stepped, does not warm up again."""

    def __init__(self, net: torch.nn.Module, greedy: bool = False, warm_up: bool = False):
        super().__init__(net, greedy)
        self.warm_up = warm_up and not greedy

    def random_actions(self, obs, generator: torch.Generator) -> torch.Tensor | None:
        """Uniform actions in the environment's box while warming up; None after."""
        if self.warm_up and bool(self.net.learning):
            self.warm_up = False  # learning started: no need to read the flag again
        if not self.warm_up:
            return None
        shape = (F.obs_len(obs), self.net.action_low.numel())
        uniform = torch.rand(shape, generator=generator, device=self.device)
        return self.net.to_env(uniform * 2.0 - 1.0)


class NoisyDeterministicPolicy(WarmUpPolicy):
    """A :class:`~rlherd.core.Policy` for a deterministic policy in the canonical box (D4PG, DDPG,
    TD3): ``pi(obs) + sigma * N(0, 1)``, clipped to the box and rescaled to the environment's
    bounds (Acme's ``ClippedGaussian`` then ``ClipToSpec``). The noise draws from the caller's
    generator, so a :class:`TransitionActor` (or poly's batched inference) decides whose random
    stream exploration consumes. ``greedy`` (evaluation) acts with ``pi(obs)`` alone."""

    def __init__(
        self, net: torch.nn.Module, sigma: float, greedy: bool = False, warm_up: bool = False
    ):
        super().__init__(net, greedy, warm_up)
        self.sigma = sigma

    @torch.no_grad()
    def __call__(self, obs, first, state, generator):
        random = self.random_actions(obs, generator)
        if random is not None:
            return {F.ACTION: random}, state
        action = self.net.policy(to_device(obs, self.device))
        if not self.greedy and self.sigma > 0:
            noise = torch.randn(action.shape, generator=generator, device=self.device)
            action = action + self.sigma * noise
        return {F.ACTION: self.net.to_env(action)}, state


class TanhGaussianSamplingPolicy(WarmUpPolicy):
    """A :class:`~rlherd.core.Policy`: ``tanh(mean + std * N(0, 1))`` from the caller's
    generator, rescaled to the environment's bounds; ``greedy`` (evaluation): ``tanh(mean)``."""

    @torch.no_grad()
    def __call__(self, obs, first, state, generator):
        random = self.random_actions(obs, generator)
        if random is not None:
            return {F.ACTION: random}, state
        mean, log_std = self.net.policy(to_device(obs, self.device))
        u = mean
        if not self.greedy:
            u = mean + log_std.exp() * torch.randn(mean.shape, generator=generator,
                                                   device=self.device)  # fmt: skip
        return {F.ACTION: self.net.to_env(torch.tanh(u))}, state


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
        obs = F.map_obs(as_tensor, obs)
        state = self.state
        outputs, self.state = self.policy(obs, self.first, state, self.generator)
        self.first = torch.zeros_like(self.first)
        if self.writer is not None:
            self.writer.add_row(core_state=state, **F.obs_fields(F.OBS, obs), **outputs)
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
                torch.as_tensor(np.asarray(skip, dtype=bool)),
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


class TransitionActor:
    """Acts in a batch of environments with ``policy``, whose exploration (noise, sampling) draws
    from this actor's ``seed``, and, with an ``adder``, writes the transitions taken. Without an
    adder it only acts (an evaluator, whose policy is the evaluation one)."""

    def __init__(
        self,
        policy: Policy,
        adder: BatchAdder | None,
        seed: int,
        client: VariableClient | None = None,
    ):
        self.policy, self.adder, self.client = policy, adder, client
        self.generator = torch.Generator(getattr(policy, "device", "cpu")).manual_seed(seed)

    @classmethod
    def build(cls, policy, adder: BatchAdder | None, seed: int,
              variable_source: VariableSource | None, update_period: int) -> TransitionActor:
        """What a builder's ``make_actor`` returns: parameters come from ``variable_source``
        (fetched every ``update_period`` steps) into ``policy.net``; none: the policy's own."""
        client = None
        if variable_source is not None:
            client = VariableClient(variable_source, policy.net, "policy", update_period)
        return cls(policy, adder, seed, client)

    @torch.no_grad()
    def select_action(self, obs: np.ndarray) -> np.ndarray:
        obs = F.map_obs(as_tensor, obs)
        first = torch.zeros(F.obs_len(obs), dtype=torch.bool)
        outputs, _ = self.policy(obs, first, (), self.generator)
        return outputs[F.ACTION].cpu().numpy()

    def observe_first(self, obs: np.ndarray, envs: np.ndarray) -> None:
        if self.adder is not None:
            self.adder.add_first(obs, envs)

    def observe(self, action, reward, next_obs, terminated, truncated, skip, extras=None) -> None:
        if self.adder is not None:
            self.adder.add(action, reward, next_obs, terminated, truncated, skip, extras)

    def update(self, wait: bool = False) -> None:
        if self.client is not None:
            self.client.update(wait)

    def state_dict(self) -> dict[str, Any]:
        adder = self.adder.state_dict() if self.adder is not None else None
        return dict(generator=self.generator.get_state(), adder=adder)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        if self.adder is not None:
            self.adder.load_state_dict(state["adder"])
