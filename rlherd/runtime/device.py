"""The ``device`` runtime: WarpDrive's pipeline (Lan et al. 2021) with torch on one device.

The environment (:mod:`rlherd.envs.device`), the policies, the sampler, the rollout buffers and
the learners all live on ``config.device``. Each iteration steps ``num_envs`` games for
``unroll_length`` steps into preallocated ``[T + 1, num_envs, num_agents]`` buffers, then each
policy (an agent group, e.g. ``tagger`` and ``runner``, with its own network, optimiser, learning
rate and entropy schedule from ``policy_overrides``) learns from its agents' slice with PPO's
learner: GAE, then A2C (``objective=a2c``, WarpDrive's trainer) or real PPO (stored behaviour
log-probs, several epochs of minibatches, clipping). Nothing crosses to the host inside a rollout;
episode statistics are summed on the device and read once per iteration.

``actor_steps`` counts agent steps (game steps x agents). A checkpoint holds the games, the
buffers' bootstrap row, the learners and every generator, so ``--resume`` continues exactly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlherd import types as F
from rlherd.agents.ppo.learning import PPOLearner
from rlherd.agents.ppo.networks import MultiCategorical, PPONet
from rlherd.core import EnvSpec
from rlherd.envs.device import (
    DeviceEnv,
    make_device,
    sample_categorical,
    sample_multi_categorical,
)
from rlherd.run.config import ConfigError, apply_overrides
from rlherd.run.recorder import Recorder
from rlherd.runtime import checkpoint_state, set_rng_state


def policy_spec(env: DeviceEnv, env_id: str) -> EnvSpec:
    """The spec every agent of ``env`` shares: a vector observation and (multi-)discrete
    actions."""
    common = dict(env_id=env_id, obs_shape=(env.obs_dim,), obs_dtype=np.dtype(np.float32))
    if len(env.action_nvec) == 1:
        return EnvSpec(action_kind="discrete", num_actions=env.action_nvec[0], **common)
    nvec = tuple(env.action_nvec)
    return EnvSpec(action_kind="multidiscrete", action_nvec=nvec, action_shape=(len(nvec),),
                   **common)  # fmt: skip


class Policy:
    """One agent group: its ids, network and learner."""

    def __init__(self, name: str, ids: list[int], net: PPONet, learner: PPOLearner):
        self.name, self.net, self.learner = name, net, learner
        self.ids = torch.as_tensor(ids, device=next(net.parameters()).device)
        self.forward = torch.compile(net) if learner.config.compile else net

    @torch.no_grad()
    def act(self, obs: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        """``obs [E, n, D]`` -> actions, log probs, distribution parameters, values."""
        E, n = obs.shape[:2]
        params, value = self.forward(obs.reshape(E * n, -1))
        dist = self.net.dist
        if isinstance(dist, MultiCategorical):  # one sample per head
            action = sample_multi_categorical(list(dist.split(params)), generator)
        else:
            action = sample_categorical(params, generator)
        log_prob = dist.log_prob(params, action)
        return (x.reshape(E, n, *x.shape[1:]) for x in (action, log_prob, params, value))


def make_policies(builder, env: DeviceEnv, total_steps: int) -> list[Policy]:
    config, groups = builder.config, env.policy_groups()
    unknown = set(config.policy_overrides) - set(groups)
    if unknown:
        raise ConfigError(
            f"policy_overrides names {sorted(unknown)}, but {builder.env_id}'s policies are "
            f"{sorted(groups)}"
        )
    spec = policy_spec(env, builder.env_id)
    policies = []
    for name, ids in groups.items():
        c = apply_overrides(config, config.policy_overrides.get(name, {}))
        net = PPONet(spec, c).to(config.device)
        share = total_steps * len(ids) // env.num_agents  # the agent steps this policy learns on
        policies.append(Policy(name, ids, net, PPOLearner(net, c, max(share, 1))))
    return policies


PER_GAME = (F.TERMINATED, F.TRUNCATED, F.RESET)


class Rollouts:
    """The device buffers of one iteration, ``[T + 1, E, N, ...]``, and the running episode
    statistics (summed on the device, read once per iteration)."""

    def __init__(self, env: DeviceEnv, T: int, param_dim: int):
        E, N, D, d = env.num_envs, env.num_agents, env.obs_dim, env.device
        rows = (T + 1, E)
        self.buf = {
            F.OBS: torch.zeros(*rows, N, D, device=d),
            F.ACTION: torch.zeros(T + 1, *env.action_shape, dtype=torch.int64, device=d),
            F.BEHAVIOUR_LOG_PROB: torch.zeros(*rows, N, device=d),
            F.POLICY_PARAMS: torch.zeros(*rows, N, param_dim, device=d),
            F.BASELINE: torch.zeros(*rows, N, device=d),
            F.REWARD: torch.zeros(*rows, N, device=d),
            F.TERMINATED: torch.zeros(*rows, dtype=torch.bool, device=d),
            F.TRUNCATED: torch.zeros(*rows, dtype=torch.bool, device=d),
            F.RESET: torch.zeros(*rows, dtype=torch.bool, device=d),
        }
        self.episode_return = torch.zeros(E, N, device=d)
        self.episode_length = torch.zeros(E, device=d)
        self.episode_tags = torch.zeros(E, device=d)
        self.sums = torch.zeros(N + 3, device=d)  # returns per agent, length, tags, episodes

    def slice_for(self, policy: Policy) -> dict[str, torch.Tensor]:
        """The policy's agents as a ``[T + 1, E * n]`` rollout (agents folded into the batch);
        per-game fields (flags, resets) apply to each of a game's agents."""
        n = len(policy.ids)
        out = {}
        for k, v in self.buf.items():
            v = v[:, :, None].expand(-1, -1, n) if k in PER_GAME else v.index_select(2, policy.ids)
            out[k] = v.flatten(1, 2)
        return out

    def count_step(self, env: DeviceEnv, resetting: torch.Tensor) -> None:
        live = ~resetting
        self.episode_return += env.reward
        self.episode_length += live
        self.episode_tags += env.tags
        done = (env.terminated | env.truncated).float()
        self.sums[:-3] += (self.episode_return * done[:, None]).sum(0)
        self.sums[-3] += (self.episode_length * done).sum()
        self.sums[-2] += (self.episode_tags * done).sum()
        self.sums[-1] += done.sum()
        keep = 1.0 - done
        self.episode_return *= keep[:, None]
        self.episode_length *= keep
        self.episode_tags *= keep

    _STATS = ("episode_return", "episode_length", "episode_tags", "sums")

    def state_dict(self) -> dict[str, Any]:
        """The next iteration's first row and the running episode statistics."""
        return dict(row=self.buf[F.OBS][0].clone(), reset=self.buf[F.RESET][0].clone(),
                    **{k: getattr(self, k).clone() for k in self._STATS})  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buf[F.OBS][0].copy_(state["row"])
        self.buf[F.RESET][0].copy_(state["reset"])
        for k in self._STATS:
            getattr(self, k).copy_(state[k])


def collect(env: DeviceEnv, policies: list[Policy], rollouts: Rollouts, generator) -> None:
    """Fill rows ``0..T`` (row 0 already holds the current observation and reset flags)."""
    buf, T = rollouts.buf, rollouts.buf[F.REWARD].shape[0] - 1
    for t in range(T + 1):
        for p in policies:
            action, log_prob, params, value = p.act(buf[F.OBS][t][:, p.ids], generator)
            buf[F.ACTION][t].index_copy_(1, p.ids, action)
            buf[F.BEHAVIOUR_LOG_PROB][t].index_copy_(1, p.ids, log_prob)
            buf[F.POLICY_PARAMS][t].index_copy_(1, p.ids, params)
            buf[F.BASELINE][t].index_copy_(1, p.ids, value)
        if t == T:
            break  # the bootstrap row: values only
        resetting = buf[F.RESET][t]
        obs, reward, terminated, truncated = env.step(buf[F.ACTION][t])
        buf[F.REWARD][t] = reward
        buf[F.TERMINATED][t] = terminated
        buf[F.TRUNCATED][t] = truncated
        buf[F.OBS][t + 1] = obs
        buf[F.RESET][t + 1] = terminated | truncated
        rollouts.count_step(env, resetting)
    buf[F.OBS][0] = buf[F.OBS][T]  # the next iteration starts from the bootstrap row
    buf[F.RESET][0] = buf[F.RESET][T]


def _report(recorder: Recorder, env: DeviceEnv, policies: list[Policy], rollouts: Rollouts):
    sums = rollouts.sums.cpu().numpy().copy()  # the one host transfer of an iteration
    rollouts.sums.zero_()
    episodes = int(sums[-1])
    if episodes == 0:
        return {}
    per_agent = sums[:-3] / episodes
    per_policy = {f"episode_return_{p.name}": float(per_agent[p.ids.cpu().numpy()].mean())
                  for p in policies}  # fmt: skip
    extra = dict(per_policy, tag_rate=float(sums[-2] / episodes))
    recorder.episode_means(episodes, float(per_agent.mean()), float(sums[-3] / episodes), **extra)
    return extra


def run_device(
    builder,
    spec: EnvSpec | None,
    recorder: Recorder,
    seed: int,
    checkpoint: dict[str, Any] | None,
    save: Callable[[dict[str, Any]], None],
    stop: threading.Event,
    evaluator=None,
) -> None:
    config = builder.config
    env = make_device(builder.env_id, config.num_envs, config.device, seed, **builder.env_kwargs)
    policies = make_policies(builder, env, recorder.total_steps)
    param_dim = policies[0].net.policy_head.out_features  # logits (device games are discrete)
    rollouts = Rollouts(env, config.unroll_length, param_dim)
    generator = torch.Generator(env.device).manual_seed(seed + 1)
    env.reset(seed=seed)
    rollouts.buf[F.OBS][0] = env.obs
    if checkpoint is not None:
        for p in policies:
            p.learner.load_state_dict(checkpoint["learner"][p.name])
        env.load_state_dict(checkpoint["env"])
        rollouts.load_state_dict(checkpoint["rollouts"])
        generator.set_state(checkpoint["generator"])
        set_rng_state(checkpoint["rng"])
    learners = _Learners(policies)
    steps_per_iteration = config.unroll_length * env.num_envs * env.num_agents

    def state() -> dict[str, Any]:
        return checkpoint_state(learners, recorder, env=env.state_dict(),
                                rollouts=rollouts.state_dict(),
                                generator=generator.get_state())  # fmt: skip

    while not recorder.done() and not stop.is_set():
        collect(env, policies, rollouts, generator)
        recorder.add_actor_steps(steps_per_iteration)
        metrics = {}
        for p in policies:
            out = p.learner.learn(rollouts.slice_for(p))
            metrics.update({f"{k}_{p.name}": v for k, v in out.items()})
        metrics.update(_report(recorder, env, policies, rollouts))
        recorder.learner(metrics)
        if recorder.tick():
            save(state())
    save(state())


class _Learners:
    """The policies' learners as one checkpointable learner."""

    def __init__(self, policies: list[Policy]):
        self.policies = policies

    def state_dict(self) -> dict[str, Any]:
        return {p.name: p.learner.state_dict() for p in self.policies}


def evaluate_device(
    run_dir: str | Path,
    meta: dict[str, Any],
    builder,
    state: dict[str, Any],
    episodes: int,
    video: str | Path | None,
    greedy: bool,
    seed: int,
) -> dict[str, Any]:
    """Play ``episodes`` games at once with the run's policies (greedy: each head's most likely
    action) and report the mean return per policy and the tag rate; game 0 is rendered to
    ``video`` if given."""
    from rlherd.run.evaluate import write_video

    env = make_device(builder.env_id, episodes, "cpu", seed, **builder.env_kwargs)
    builder.config = apply_overrides(builder.config, dict(device="cpu", compile=False))
    policies = make_policies(builder, env, 1)
    for p in policies:
        p.net.load_state_dict(state["learner"][p.name]["net"])
        p.net.eval()
    generator = torch.Generator().manual_seed(seed)
    env.reset(seed=seed)
    returns = torch.zeros(episodes, env.num_agents)
    tags = torch.zeros(episodes)
    finished = torch.zeros(episodes, dtype=torch.bool)
    frames = [env.render(0)] if video else []
    actions = torch.zeros(env.action_shape, dtype=torch.int64)
    with torch.no_grad():
        while not finished.all():
            for p in policies:
                obs = env.obs[:, p.ids]
                if greedy:
                    params, _ = p.net(obs.reshape(-1, env.obs_dim))
                    a = p.net.dist.mode(params).reshape(episodes, len(p.ids), *actions.shape[2:])
                else:
                    a = next(iter(p.act(obs, generator)))
                actions[:, p.ids] = a
            _, reward, terminated, truncated = env.step(actions)
            live = ~finished
            returns += reward * live[:, None]
            tags += env.tags * live
            finished |= terminated | truncated
            if video and not finished[0]:
                frames.append(env.render(0))
    if video:
        frames.append(env.render(0))
        write_video(Path(video), frames, fps=10)
    result = dict(
        eval_return_mean=float(returns.mean()),
        eval_tag_rate=float(tags.mean()),
        eval_episodes=episodes,
        eval_greedy=greedy,
        **{f"eval_return_{p.name}": float(returns[:, p.ids.cpu()].mean()) for p in policies},
    )
    return result
