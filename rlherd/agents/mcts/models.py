"""The models a search steps (``model=`` in MCTS's config).

:class:`Simulator` is the environment itself: a node's state is a copy of the environment taken
at that node, and stepping a node copies it again and steps the copy, so the environments being
played never move. :class:`LearnedModel` is Acme's MLP transition model: a node's state is a
predicted observation.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from rlherd import envs as rl_envs
from rlherd import types as F
from rlherd.agents.mcts.search import ModelStep
from rlherd.core import EnvSpec, stack_obs
from rlherd.errors import ConfigError


class Snapshot(NamedTuple):
    """An environment as it was at a node. ALE environments share their emulator with their
    copies (copying one boots a new console: 0.1 s); its state, random generator included,
    travels beside them."""

    env: gym.Env
    emulator: Any


def _emulator(env: gym.Env):
    return getattr(env.unwrapped, "ale", None)


def _shared(env: gym.Env) -> dict[int, Any]:
    """A ``deepcopy`` memo of what a step never changes, so copies share it: spaces and specs
    (copying CartPole falls from 230 to 130 microseconds) and pygame's rendering objects (a
    rendered environment's window and clock, which cannot be copied). An ALE game is shared
    whole: its Python side keeps no state of its own, and its emulator's is saved apart."""
    memo: dict[int, Any] = {}
    layer = env
    while True:
        for value in vars(layer).values():
            if (isinstance(value, gym.Space | gym.envs.registration.EnvSpec)
                    or type(value).__module__.startswith("pygame")):  # fmt: skip
                memo[id(value)] = value
        if not isinstance(layer, gym.Wrapper):
            break
        layer = layer.env
    if _emulator(env) is not None:
        memo[id(env.unwrapped)] = env.unwrapped
    return memo


def legal_actions(obs: Any) -> np.ndarray | None:
    """The actions legal in each row of a batch of observations: their ``action_mask``, where
    the environment has one (board games: see :mod:`rlherd.envs.openspiel`); None: every
    action."""
    mask = F.action_mask(obs)
    return None if mask is None else np.asarray(mask, dtype=bool)


OUT_OF_REACH = ("model=simulator searches with copies of the environments it plays, and these "
                "are out of its reach here")
GAME_ROWS = (f"{OUT_OF_REACH} (a PettingZoo game's rows, whose step moves its other players "
             "too)")


def in_game(spec: EnvSpec) -> bool:
    """A PettingZoo game's rows (its agents', or a turn-based game's with the opponent's
    replies): no Gymnasium environment a simulator could copy, on any runtime."""
    return rl_envs.family(spec.env_id) == "pettingzoo"


def learned_refusal(spec: EnvSpec) -> str | None:
    """Why ``model=learned`` cannot search ``spec``'s environment; None where it can."""
    if not spec.structured:
        return None
    return (f"model=learned predicts the next observation as one array, and {spec.env_id} "
            f"observes a dict of arrays ({', '.join(spec.obs)}; an action mask makes one too)")


def cannot_train(env_id: str, simulator: str, learned: str) -> ConfigError:
    """Neither model can search ``env_id``: the one line that says so, rather than each model's
    refusal sending the user to the other."""
    return ConfigError(f"MCTS cannot train {env_id}, as neither of its models can search it: "
                       f"{simulator}; and {learned}. Train it with another agent (rlherd "
                       f"check-env {env_id} lists those that can)")  # fmt: skip


class Simulator:
    """``model=simulator``: searches step copies of the environments the actor plays, which it
    is handed (``bind``) by the environment loop. The search is exact for deterministic
    environments; a stochastic one is sampled once per edge. ``spec``, the environment's, lets a
    refusal say whether ``model=learned`` can search it instead."""

    def __init__(self, spec: EnvSpec) -> None:
        self.spec = spec
        self.envs: list[gym.Env] | None = None
        self.memos: list[dict[int, Any]] = []

    def bind(self, envs: list[gym.Env] | None) -> None:
        if envs is None:
            raise self._out_of_reach()
        self.envs, self.memos = list(envs), [_shared(env) for env in envs]
        for env, memo in zip(self.envs, self.memos, strict=True):
            try:
                copy.deepcopy(env, dict(memo))
            except Exception as e:
                name = env.spec.id if env.spec else type(env).__name__
                raise self._refused(f"model=simulator copies the environment at every node, "
                                    f"and {name} cannot be copied ({type(e).__name__}: {e})",
                                    "use --set model=learned") from e  # fmt: skip

    def _out_of_reach(self) -> ConfigError:
        """A game's rows are always out of reach; other environments are not with
        ``--env-workers 0`` and ``--native-vector-env false``."""
        if in_game(self.spec):
            return self._refused(GAME_ROWS, "--set model=learned")
        flags = "--env-workers 0 and --native-vector-env false"
        why = (f"{OUT_OF_REACH} (BatchEnv processes with env_workers > 0, or ale-py's native "
               "vector env)")  # fmt: skip
        learned = learned_refusal(self.spec)
        if learned is not None:
            return ConfigError(f"{why}: {flags} bring them in reach ({learned})")
        return ConfigError(f"{why}: --set model=learned, or {flags}")

    def _refused(self, why: str, fix: str) -> ConfigError:
        """``why``, and ``fix`` (the learned model) where it can search the environment."""
        learned = learned_refusal(self.spec)
        if learned is None:
            return ConfigError(f"{why}; {fix}")
        return cannot_train(self.spec.env_id, why, learned)

    def _snapshot(self, env: gym.Env, i: int) -> Snapshot:
        emulator = _emulator(env)
        state = emulator.cloneState(include_rng=True) if emulator is not None else None
        return Snapshot(copy.deepcopy(env, dict(self.memos[i])), state)

    def roots(self, indices: np.ndarray, obs: Any):
        """The snapshots of environments ``indices`` now (observed as ``obs``), and their legal
        actions."""
        if self.envs is None:
            raise RuntimeError("bind the environments first (the environment loop does)")
        for i in indices:  # rendering may have made objects since the last search
            self.memos[i] = _shared(self.envs[i])
        roots = [(i, self._snapshot(self.envs[i], i)) for i in indices]
        return roots, legal_actions(obs)

    def step(self, states: list[tuple[int, Snapshot]], actions: np.ndarray) -> ModelStep:
        out, obs, reward, terminal, truncated = [], [], [], [], []
        for (i, snap), action in zip(states, actions, strict=True):
            env = copy.deepcopy(snap.env, dict(self.memos[i]))
            if snap.emulator is not None:
                _emulator(env).restoreState(snap.emulator)
            o, r, term, trunc, _ = env.step(action)
            out.append((i, self._snapshot_stepped(env, snap)))
            obs.append(o)
            reward.append(r)
            terminal.append(term)
            truncated.append(trunc)
        obs_ = stack_obs(obs)
        reward_, terminal_ = np.asarray(reward, np.float64), np.asarray(terminal, bool)
        truncated_ = np.asarray(truncated, bool)
        return ModelStep(out, obs_, reward_, terminal_, truncated_, legal_actions(obs_))

    @staticmethod
    def _snapshot_stepped(env: gym.Env, parent: Snapshot) -> Snapshot:
        """The copy just stepped is the child's state; nothing else holds it."""
        if parent.emulator is None:
            return Snapshot(env, None)
        return Snapshot(env, _emulator(env).cloneState(include_rng=True))

    def after_search(self, roots: list[tuple[int, Snapshot]]) -> None:
        """Put the shared emulators back where the played environments were."""
        for i, snap in roots:
            if snap.emulator is not None:
                _emulator(self.envs[i]).restoreState(snap.emulator)


class LearnedModel:
    """``model=learned``: the transition network (learned with the policy and value, from the same
    replay) predicts the next observation, the reward and whether the episode ends there
    (continuation probability below one half)."""

    def __init__(self, net: torch.nn.Module):
        self.net = net

    def bind(self, envs: list[gym.Env] | None) -> None:
        """A learned model needs no environment."""

    def roots(self, indices: np.ndarray, obs: np.ndarray):
        return list(np.asarray(obs, dtype=np.float32)), None

    @torch.no_grad()
    def step(self, states: list[np.ndarray], actions: np.ndarray) -> ModelStep:
        device = next(self.net.parameters()).device
        obs = torch.as_tensor(np.stack(states), device=device)
        next_obs, reward, continues = self.net(obs, torch.as_tensor(actions, device=device))
        next_obs = next_obs.cpu().numpy()
        terminal = (continues < 0).cpu().numpy()  # logit < 0: continuation below one half
        return ModelStep(list(next_obs), next_obs, reward.cpu().numpy().astype(np.float64),
                         terminal, np.zeros_like(terminal), None)  # fmt: skip

    def after_search(self, roots: list[Any]) -> None:
        """Nothing to put back."""
