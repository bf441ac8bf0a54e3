"""The ``device`` runtime: WarpDrive's pipeline (Lan et al. 2021) with torch on one device.

The environment (:mod:`rlherd.envs.device`), the policies, the rollouts and the learners all
live on ``settings.device``. A game's agents fall into policies (agent groups, e.g. ``tagger``
and ``runner``; the run's ``policies`` setting regroups them, as on every runtime); each gets
its own networks, policy, rollouts and learner from the agent's builder, with the agent's
config changed by that group's ``policy_overrides`` (WarpDrive's per-policy learning rates).
Every step, each policy acts for its agents of every game at once (agents folded into the
batch: ``[E * n]``) and its rows go through a :class:`~rlherd.replay.rollouts.RolloutQueue` on
the device; whenever a ``[T + 1, E * n]``
rollout is complete, that policy's learner steps on it. This is the ``single`` runtime's loop
with the builder's batched policy in place of its actor, which the device does not run: an agent
whose actor changes its data (PPO's reward scaling) is refused with the reason.

Nothing crosses to the host inside a rollout; episode returns (per agent) and lengths are summed
on the device by one :class:`~rlherd.run.counting.EpisodeTracker` and read once per rollout.
Games with several policies report each policy's returns (``final_return_mean_tagger``, ...),
never their average. ``actor_steps`` counts agent steps (game steps x agents). A checkpoint
holds the games, the rollouts, the learners and every generator, so ``--resume`` continues
exactly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlherd import types as F
from rlherd.config import apply_overrides
from rlherd.core import EnvSpec, Leaf, policy_state
from rlherd.envs.device import DeviceEnv, make_device
from rlherd.envs.device.base import record_graph
from rlherd.envs.pettingzoo import assign_policies
from rlherd.errors import ConfigError
from rlherd.replay.rollouts import RolloutQueue, allocate_rollout, rollout_layout
from rlherd.run.counting import EpisodeTracker
from rlherd.run.rundir import RunRecord, fitting
from rlherd.run.video import write_video
from rlherd.runtime import RunContext, checkpoint_state, set_rng_state


def policy_spec(env: DeviceEnv, env_id: str) -> EnvSpec:
    """The spec every agent of ``env`` shares: a vector observation and (multi-)discrete
    actions."""
    common = dict(env_id=env_id, obs=Leaf((env.obs_dim,), np.dtype(np.float32)))
    if len(env.action_nvec) == 1:
        return EnvSpec(action_kind="discrete", num_actions=env.action_nvec[0], **common)
    nvec = tuple(env.action_nvec)
    return EnvSpec(action_kind="multidiscrete", action_nvec=nvec, action_shape=(len(nvec),),
                   **common)  # fmt: skip


@dataclass
class Group:
    """One policy: its agents' ids, its builder (the agent's, with the group's overrides), its
    networks and the batched policy acting with them, its recurrent state and its rollouts."""

    name: str
    ids: torch.Tensor
    builder: Any
    networks: Any
    policy: Any
    state: tuple[torch.Tensor, ...]
    rollouts: RolloutQueue
    learner: Any = None

    def observe(self, batch: torch.Tensor) -> torch.Tensor:
        """``[E, N, ...]`` -> this group's agents, folded into the batch: ``[E * n, ...]``."""
        return batch.index_select(1, self.ids).flatten(0, 1)

    def per_agent(self, per_game: torch.Tensor) -> torch.Tensor:
        """``[E]`` -> ``[E * n]``: a game's flag applies to each of its agents."""
        return per_game[:, None].expand(-1, len(self.ids)).flatten()


def make_groups(
    builder, env_id: str, settings: Any, env: DeviceEnv, evaluation: bool = False
) -> list[Group]:
    """One :class:`Group` per policy of ``env`` (its learner is made by the caller)."""
    groups = env.policy_groups()
    if settings.policies:  # the run's mapping, by the reference's agent names
        mapped = assign_policies(env.agent_names, settings.policies)
        groups = {name: [i for i, p in enumerate(mapped) if p == name]
                  for name in dict.fromkeys(mapped)}  # fmt: skip
    unknown = set(settings.policy_overrides) - set(groups)
    if unknown:
        raise ConfigError(
            f"policy_overrides names {sorted(unknown)}, but {env_id}'s policies are "
            f"{sorted(groups)}"
        )
    spec = policy_spec(env, env_id)
    out = []
    for name, ids in groups.items():
        group_builder = copy.copy(builder)
        group_builder.config = apply_overrides(
            builder.config, settings.policy_overrides.get(name, {})
        )
        networks = group_builder.make_networks(spec, settings.device)
        acting_networks = torch.compile(networks) if settings.compile else networks
        policy = group_builder.make_policy(acting_networks, evaluation=evaluation)
        batch = env.num_envs * len(ids)
        state = policy.initial_state(batch)
        fields = rollout_layout(spec, group_builder.rollout_fields(spec))
        buffer = allocate_rollout(fields, group_builder.unroll_length, batch, state,
                                  device=settings.device)  # fmt: skip
        ids = torch.as_tensor(ids, device=env.device)
        out.append(Group(name, ids, group_builder, networks, policy, state, RolloutQueue(buffer)))
    return out


def check(builder, settings: Any) -> None:
    """The device acts with the builder's policy alone; refuse what only the actor does (for
    the agent's config and each policy's overrides of it)."""
    features = set(builder.actor_only_features())
    for overrides in settings.policy_overrides.values():
        group_builder = copy.copy(builder)
        group_builder.config = apply_overrides(builder.config, overrides)
        features |= set(group_builder.actor_only_features())
    features = sorted(features)
    if features:
        raise ConfigError(
            f"{builder.name}'s {', '.join(features)} happens in its actor, which the device "
            f"runtime does not run (it acts with the policy alone); set "
            f"{', '.join(f'{f}=None' for f in features)} with --set, or use another runtime"
        )


class DeviceLoop:
    """Steps every game once per :meth:`step`: each group acts for its agents and writes its
    row, the games step, each group records the outcome, and every group whose rollout is
    complete learns. ``first`` marks the games whose next observation begins an episode.

    With ``cuda_graph``, a training step is recorded as a CUDA graph, one for each rollout row
    it writes, and replayed: the policies, the rollouts and the games are many small kernels a
    step, and launching them one by one from Python costs more than running them.
    Recording starts once a rollout is complete (every kernel has run once), and the step that
    completes a rollout stays eager, since it hands the rollout to the learner. Everything a
    replay reads or writes is updated in place (the recurrent states, ``first``, the rollouts,
    the games), and the learners change the networks' parameters in place, so the replay acts
    with the newest ones. Both generators are registered with each graph, so a replayed step
    draws what the eager step draws: a run is the same with or without it."""

    MAX_GRAPHS = 512  # steps beyond this many rows (or tuples of groups' rows) stay eager

    def __init__(self, env: DeviceEnv, groups: list[Group], seed: int, cuda_graph: bool = False):
        if cuda_graph and (env.device.type != "cuda" or env.cuda_graph):
            raise ValueError("recording the steps needs games on a CUDA device that do not "
                             "record their own step")  # fmt: skip
        self.env, self.groups, self.cuda_graph = env, groups, cuda_graph
        self.generator = torch.Generator(env.device).manual_seed(seed + 1)
        E, N = env.num_envs, env.num_agents
        env.reset(seed=seed)
        self.first = torch.ones(E, dtype=torch.bool, device=env.device)
        self.actions = torch.zeros(env.action_shape, dtype=torch.int64, device=env.device)
        # Returns per agent, and (a last column) the Tag games' tags.
        self.episodes = EpisodeTracker(torch.zeros(E, N + 1, device=env.device),
                                       torch.zeros(E, device=env.device))  # fmt: skip
        self.graphs: dict[tuple[int, ...], torch.cuda.CUDAGraph] = {}  # by the rows written
        self.warm = False  # every kernel of a step has run (a rollout was completed)
        if cuda_graph:  # the graphs' stream, and the scratch memory they share (replayed in turn)
            self.stream, self.pool = torch.cuda.Stream(env.device), torch.cuda.graph_pool_handle()

    @torch.no_grad()
    def step(self, record: bool = True) -> torch.Tensor:
        """One step of every game; returns the mask of games whose episode it ended. With
        ``record`` off (evaluation) nothing is written to the rollouts."""
        rows = tuple(g.rollouts.t for g in self.groups)
        if record and self._graphable(rows):
            graph = self.graphs.get(rows) or self._capture(rows)
            graph.replay()
            for g in self.groups:  # what add_outcome does on the host
                g.rollouts.t += 1
        else:
            self.warm |= self._act_and_step(record)
        env = self.env
        tagged = torch.cat([env.reward, env.tags[:, None]], 1)
        return self.episodes.step(tagged, env.terminated, env.truncated, self.first)

    def _act_and_step(self, record: bool) -> bool:
        """The policies act, the games step, and (``record``) the rollouts get the row and its
        outcome; whether a rollout was completed."""
        env, completed = self.env, False
        for g in self.groups:
            first = g.per_agent(self.first)
            keep = (~first).float()[None, :, None]  # the stored state of a first row is zero
            state = tuple(s * keep for s in g.state)
            obs = g.observe(env.obs)
            outputs, new_state = g.policy(obs, first, state, self.generator)
            for s, new in zip(g.state, new_state, strict=True):
                s.copy_(new)
            if record:
                completed |= g.rollouts.add_row(core_state=state, obs=obs, **outputs)
            action = outputs[F.ACTION]
            self.actions.index_copy_(1, g.ids, action.view(-1, len(g.ids), *action.shape[1:]))
        resetting = env.terminated | env.truncated
        _, reward, terminated, truncated = env.step(self.actions)
        if record:
            for g in self.groups:
                g.rollouts.add_outcome(g.observe(reward), g.per_agent(terminated),
                                       g.per_agent(truncated))  # fmt: skip
        self.first.copy_(resetting)
        return completed

    def _graphable(self, rows: tuple[int, ...]) -> bool:
        """Whether this training step replays a graph: recording is on and warm, the step does
        not complete a rollout, and its rows have a graph or room for one."""
        if not (self.cuda_graph and self.warm):
            return False
        completes = any(t == g.rollouts.T for t, g in zip(rows, self.groups, strict=True))
        return not completes and (rows in self.graphs or len(self.graphs) < self.MAX_GRAPHS)

    def _capture(self, rows: tuple[int, ...]) -> torch.cuda.CUDAGraph:
        """Record the step that writes ``rows`` (recording runs the Python once but no kernel:
        the host's row counters are put back, and the replay that follows does the step)."""

        def kept() -> list[torch.Tensor]:
            states = [s for g in self.groups for s in g.state]
            return [*self.env.kept_tensors(), *states, self.first, self.actions]

        graph = record_graph(lambda: self._act_and_step(record=True), self.env.device,
                             [self.generator, self.env.generator], self.stream, self.pool,
                             kept)  # fmt: skip
        for g, t in zip(self.groups, rows, strict=True):
            g.rollouts.t = t
        self.graphs[rows] = graph
        return graph

    def learn(self) -> dict[str, float]:
        """A learner step for every group whose rollout is complete; their metrics."""
        metrics: dict[str, float] = {}
        for g in self.groups:
            if g.rollouts.ready():
                out = g.learner.step()
                suffix = f"_{g.name}" if len(self.groups) > 1 else ""
                metrics.update({f"{k}{suffix}": v for k, v in out.items()})
        return metrics

    def report(self, recorder) -> None:
        """The episodes ended since the last report, by their means (one read from the device):
        each policy's mean return, and for games of several agents the tag rate."""
        count, means, length = self.episodes.take()
        if count == 0:
            return
        means = means.cpu()
        returns = {g.name: float(means[g.ids.cpu()].mean()) for g in self.groups}
        extra = dict(tag_rate=float(means[-1])) if self.env.num_agents > 1 else {}
        recorder.episode_means(count, returns, length, **extra)

    def state_dict(self) -> dict[str, Any]:
        return dict(env=self.env.state_dict(), generator=self.generator.get_state(),
                    first=self.first.clone(), episodes=self.episodes.state_dict(),
                    groups={g.name: dict(state=tuple(s.clone() for s in g.state),
                                         rollouts=g.rollouts.state_dict())
                            for g in self.groups})  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.env.load_state_dict(state["env"])
        self.generator.set_state(state["generator"])
        self.first.copy_(state["first"])
        self.episodes.load_state_dict(state["episodes"])
        for g in self.groups:  # in place: a recorded step reads these very tensors
            for s, saved in zip(g.state, state["groups"][g.name]["state"], strict=True):
                s.copy_(saved)
            g.rollouts.load_state_dict(state["groups"][g.name]["rollouts"])


class Learners:
    """The groups' learners as one checkpointable learner (keyed by policy name)."""

    def __init__(self, groups: list[Group]):
        self.groups = groups

    def state_dict(self) -> dict[str, Any]:
        return {g.name: g.learner.state_dict() for g in self.groups}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for g in self.groups:
            g.learner.load_state_dict(state[g.name])


def run(ctx: RunContext) -> None:
    settings, recorder = ctx.settings, ctx.recorder
    num_envs = settings.num_envs or ctx.builder.batch_size
    env = make_device(ctx.env_id, num_envs, settings.device, ctx.seed, **ctx.env_kwargs)
    groups = make_groups(ctx.builder, ctx.env_id, settings, env)
    recorder.open_windows(g.name for g in groups)
    for g in groups:  # the agent steps this policy learns on
        share = recorder.total_steps * len(g.ids) // env.num_agents
        g.learner = g.builder.make_learner(g.networks, g.rollouts, max(share, 1))
    loop, learners = DeviceLoop(env, groups, ctx.seed, settings.cuda_graph), Learners(groups)
    if ctx.checkpoint is not None:
        with ctx.restoring():
            learners.load_state_dict(ctx.checkpoint["learner"])
            loop.load_state_dict(ctx.checkpoint["loop"])
            set_rng_state(ctx.checkpoint["rng"])

    def state() -> dict[str, Any]:
        return checkpoint_state(learners, recorder, loop=loop.state_dict())

    while not recorder.done() and not ctx.stop.is_set():
        for _ in range(ctx.builder.unroll_length):  # report once per rollout
            loop.step()
            recorder.add_actor_steps(env.num_envs * env.num_agents)
            metrics = loop.learn()
            if metrics:
                recorder.learner(metrics)
        loop.report(recorder)
        ctx.tick(state)
    ctx.write_checkpoint(state)


def spec(record: RunRecord) -> None:
    """Check the run's device environment id and options (the runs of this runtime take their
    specs from the device environment, so they have none before it starts)."""
    make_device(record.env, 1, "cpu", **record.env_kwargs)
    if record.eval_every:
        raise ConfigError("evaluations during training (--eval-every, --eval-episodes) are not "
                          "supported on the device runtime; use rlherd eval RUN after it")


def evaluate(
    record: RunRecord,
    builder,
    checkpoint: dict[str, Any],
    source: Path,
    episodes: int,
    video: str | Path | None,
    greedy: bool,
    seed: int,
) -> dict[str, Any]:
    """Play ``episodes`` games at once on the CPU with the run's policies (greedy: each one's
    evaluation policy) and report each policy's mean return over the first episode of every
    game, and the tag rate; game 0 is rendered to ``video`` if given. A checkpoint (read from
    ``source``) that does not fit the run's config is one line."""
    from rlherd.runtime.settings import resolve

    env = make_device(record.env, episodes, "cpu", seed, **record.env_kwargs)
    settings = resolve(record.runtime, {}, dict(record.settings, device="cpu", compile=False,
                                                         cuda_graph=False))  # fmt: skip
    groups = make_groups(builder, record.env, settings, env, evaluation=greedy)
    for g in groups:
        with fitting(source):
            g.networks.load_state_dict(policy_state(checkpoint["learner"][g.name]))
        g.networks.eval()
    loop = DeviceLoop(env, groups, seed)
    finished = torch.zeros(episodes, dtype=torch.bool)
    returns = torch.zeros(episodes, env.num_agents + 1)  # per agent, then tags
    frames = [env.render(0)] if video else []
    while not finished.all():
        ended = loop.step(record=False) & ~finished
        returns[ended] = loop.episodes.returns[ended]
        finished |= ended
        if video and not finished[0]:
            frames.append(env.render(0))
    if video:
        frames.append(env.render(0))
        write_video(Path(video), frames, fps=10)
    result = dict(eval_episodes=episodes, eval_greedy=greedy,
                  **{f"eval_return_{g.name}": float(returns[:, g.ids].mean()) for g in groups})
    if len(groups) == 1:
        result["eval_return_mean"] = result.pop(f"eval_return_{groups[0].name}")
    if env.num_agents > 1:
        result["eval_tag_rate"] = float(returns[:, -1].mean())
    return result
