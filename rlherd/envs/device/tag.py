"""The Tag games (``../shared/specs/tag.md``) on a torch device: every game and every agent at
once, as tensors ``[num_envs, num_agents]``. The numpy references in
:mod:`rlherd.envs.reference.tag` say the same rules one agent at a time.

Both games end (``terminated``) at the episode length as well as on their own terminal events:
the observation includes ``t / episode_length``, so the end of time is part of the game, not a
truncation to bootstrap through.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from rlherd.envs.device.base import DeviceEnv
from rlherd.envs.reference.tag import (
    GRID_MOVES,
    TagContinuousConfig,
    TagContinuousReference,
    TagGridWorldConfig,
    TagGridWorldReference,
)


class TagGridWorld(DeviceEnv):
    """Discrete Tag: ``num_taggers`` taggers (ids ``0..``) chase one runner (the last id)."""

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        fixed_start: bool = False,
        cuda_graph: bool = False,
        **config: Any,
    ):
        self.config = c = TagGridWorldConfig(**config)
        self.num_agents, self.obs_dim, self.action_nvec = c.num_agents, c.obs_dim, (5,)
        super().__init__(num_envs, device, seed, fixed_start, cuda_graph)
        self.moves = torch.as_tensor(GRID_MOVES, device=self.device)
        self.is_tagger = torch.arange(c.num_agents, device=self.device) < c.num_taggers
        self.types = (~self.is_tagger).float()  # 0 tagger, 1 runner

    @property
    def agent_names(self) -> list[str]:
        return TagGridWorldReference.agent_names(self.config)

    def reference(self) -> TagGridWorldReference:
        return TagGridWorldReference(**vars(self.config))

    def policy_groups(self) -> dict[str, list[int]]:
        return {"tagger": list(range(self.config.num_taggers)), "runner": [self.num_agents - 1]}

    def render(self, i: int = 0) -> np.ndarray:
        pos = self.state["pos"][i].cpu().numpy()
        return _draw_arena(pos[:-1], pos[-1:], np.empty((0, 2)), self.config.grid_length,
                           int(self.state["timestep"][i]))  # fmt: skip

    def _start_state(self) -> dict[str, torch.Tensor]:
        c, E = self.config, self.num_envs
        pos = torch.randint(0, c.grid_length + 1, (E, c.num_agents, 2), generator=self.generator,
                            device=self.device)  # fmt: skip
        return dict(pos=pos, timestep=torch.zeros(E, dtype=torch.int64, device=self.device))

    def _transition(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        c, pos, t = self.config, self.state["pos"], self.state["timestep"]
        moved = pos + self.moves[actions]
        clipped = moved.clamp(0, c.grid_length)
        wall = (clipped != moved).any(-1)
        pos.copy_(clipped)
        t += 1
        tagged = (pos[:, :-1] == pos[:, -1:]).all(-1).any(-1)  # a tagger on the runner's cell
        on_tag = torch.where(self.is_tagger, c.tag_reward_for_tagger, -c.tag_penalty_for_runner)
        no_tag = torch.where(self.is_tagger, -c.step_cost_for_tagger, c.step_cost_for_tagger)
        reward = torch.where(tagged[:, None], on_tag, no_tag) - c.wall_hit_penalty * wall
        self.tags.copy_(tagged)
        terminated = tagged | (t >= c.episode_length)
        return reward, terminated, torch.zeros_like(terminated)

    def _observe(self) -> torch.Tensor:
        c, E, N = self.config, self.num_envs, self.num_agents
        xy = self.state["pos"].float() / c.grid_length  # [E, N, 2]
        t = (self.state["timestep"].float() / c.episode_length)[:, None, None].expand(E, N, 1)
        types = self.types.expand(E, N)
        if c.use_full_observation:
            shared = torch.cat([xy[..., 0], xy[..., 1], types], -1)[:, None].expand(E, N, 3 * N)
            self_onehot = torch.eye(N, device=self.device).expand(E, N, N)
            return torch.cat([shared, self_onehot, t], -1)
        runner = xy[:, -1]
        pos = self.state["pos"]  # integer distances: exact ties, broken by the lowest id
        d2 = ((pos[:, :-1] - pos[:, -1:]) ** 2).sum(-1)
        nearest = xy[torch.arange(E, device=self.device), d2.argmin(-1)]  # lowest id on ties
        other = torch.cat([runner[:, None].expand(E, N - 1, 2), nearest[:, None]], 1)
        return torch.cat([xy, other, types[..., None], t], -1)


class TagContinuous(DeviceEnv):
    """Continuous Tag: taggers and runners with speed, direction and acceleration."""

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        fixed_start: bool = False,
        cuda_graph: bool = False,
        **config: Any,
    ):
        self.config = c = TagContinuousConfig(**config)
        self.num_agents, self.obs_dim = c.num_agents, c.obs_dim
        self.action_nvec = (c.num_acceleration_levels + 1, c.num_turn_levels + 1)
        super().__init__(num_envs, device, seed, fixed_start, cuda_graph)
        d = self.device
        self.types = torch.as_tensor(c.agent_types(), device=d)  # 1 tagger, 0 runner
        self.is_tagger = self.types.bool()
        self.tagger_ids = torch.nonzero(self.is_tagger).squeeze(1)
        self.runner_ids = torch.nonzero(~self.is_tagger).squeeze(1)
        skill = torch.where(self.is_tagger, c.skill_level_tagger, c.skill_level_runner)
        self.vmax = (c.max_speed * skill).float()
        self.acc_table = torch.as_tensor(c.acceleration_table(), device=d)
        self.turn_table = torch.as_tensor(c.turn_table(), device=d)
        N = c.num_agents
        # others[i]: every agent but i, in id order (full observation).
        self.others = torch.as_tensor(
            np.array([[j for j in range(N) if j != i] for i in range(N)]), device=d
        )
        self.L = float(np.float32(c.grid_length))
        self.two_pi = float(np.float32(2 * np.pi))

    @property
    def agent_names(self) -> list[str]:
        return TagContinuousReference.agent_names(self.config)

    def reference(self) -> TagContinuousReference:
        return TagContinuousReference(**vars(self.config))

    def policy_groups(self) -> dict[str, list[int]]:
        return {"tagger": self.tagger_ids.tolist(), "runner": self.runner_ids.tolist()}

    def render(self, i: int = 0) -> np.ndarray:
        s = self.game_state(i)
        xy = np.stack([s["x"], s["y"]], -1)
        tagger = self.is_tagger.cpu().numpy()
        live = s["in_game"] & ~self.state["_exiting"][i].cpu().numpy()
        return _draw_arena(xy[tagger], xy[~tagger & live], xy[~tagger & ~live],
                           self.config.grid_length, int(s["timestep"]))  # fmt: skip

    def _start_state(self) -> dict[str, torch.Tensor]:
        E, N, d, g = self.num_envs, self.num_agents, self.device, self.generator
        zeros = torch.zeros(E, N, device=d)
        return dict(
            x=torch.rand(E, N, generator=g, device=d) * self.L,
            y=torch.rand(E, N, generator=g, device=d) * self.L,
            speed=zeros,
            direction=torch.rand(E, N, generator=g, device=d) * self.two_pi,
            acceleration=zeros,
            in_game=torch.ones(E, N, dtype=torch.bool, device=d),
            timestep=torch.zeros(E, dtype=torch.int64, device=d),
            # Runners tagged last step leave the game at the start of this one, so the
            # observation of the tagging step still shows them (the spec's order).
            _exiting=torch.zeros(E, N, dtype=torch.bool, device=d),
        )

    def _transition(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        c, s = self.config, self.state
        exiting = s["_exiting"]
        s["in_game"] &= ~exiting
        s["speed"].masked_fill_(exiting, 0.0)
        s["acceleration"].masked_fill_(exiting, 0.0)
        s["timestep"] += 1
        live = s["in_game"]

        acc = s["acceleration"] + torch.where(live, self.acc_table[actions[..., 0]], 0.0)
        turned = torch.remainder(s["direction"] + self.turn_table[actions[..., 1]], self.two_pi)
        s["direction"].copy_(torch.where(live, turned, s["direction"]))
        raw = s["speed"] + acc
        hit = (raw <= 0) | (raw >= self.vmax)
        s["acceleration"].copy_(torch.where(live & hit, 0.0, acc))
        s["speed"].copy_(torch.where(live, torch.minimum(raw.clamp(min=0), self.vmax), s["speed"]))
        x = s["x"] + s["speed"] * torch.cos(s["direction"])
        y = s["y"] + s["speed"] * torch.sin(s["direction"])
        edge = live & ((x < 0) | (x > self.L) | (y < 0) | (y > self.L))
        s["x"].copy_(torch.where(live, x.clamp(0, self.L), s["x"]))
        s["y"].copy_(torch.where(live, y.clamp(0, self.L), s["y"]))

        step_reward = torch.where(self.is_tagger, c.step_penalty_for_tagger,
                                  c.step_reward_for_runner)  # fmt: skip
        reward = torch.where(live, step_reward + c.edge_hit_penalty * edge, 0.0)

        # Each runner in the game is tagged by its nearest tagger if that one is close enough.
        rx, ry = s["x"][:, self.runner_ids], s["y"][:, self.runner_ids]
        tx, ty = s["x"][:, self.tagger_ids], s["y"][:, self.tagger_ids]
        d2 = (tx[:, None, :] - rx[:, :, None]) ** 2 + (ty[:, None, :] - ry[:, :, None]) ** 2
        nearest_d2, nearest = d2.min(-1)  # [E, runners]; the lowest tagger id on ties
        threshold = np.float32(c.tagging_distance) * np.float32(c.grid_length)
        tagged = live[:, self.runner_ids] & (torch.sqrt(nearest_d2) < threshold)
        reward[:, self.runner_ids] += c.tag_penalty_for_runner * tagged
        tags_per_tagger = torch.zeros_like(tx).scatter_add_(1, nearest, tagged.float())
        reward[:, self.tagger_ids] += c.tag_reward_for_tagger * tags_per_tagger

        end = s["timestep"] >= c.episode_length
        survivors = live[:, self.runner_ids] & ~tagged
        reward[:, self.runner_ids] += c.end_of_game_reward_for_runner * (survivors & end[:, None])
        self.tags.copy_(tagged.sum(-1))
        tagged_agents = torch.zeros_like(live)
        tagged_agents[:, self.runner_ids] = tagged
        if c.runner_exits_game_after_tagged:
            exiting.copy_(tagged_agents)
            left = survivors.sum(-1)
        else:
            left = live[:, self.runner_ids].sum(-1)
        return reward, end | (left == 0), torch.zeros_like(end)

    def _observe(self) -> torch.Tensor:
        c, s = self.config, self.state
        E, N = self.num_envs, self.num_agents
        live = s["in_game"]
        scale = (math.sqrt(2) * self.L, math.sqrt(2) * self.L, c.max_speed, c.max_speed,
                 self.two_pi)  # fmt: skip
        values = [s["x"], s["y"], s["speed"], s["acceleration"], s["direction"]]
        t = (s["timestep"].float() / c.episode_length)[:, None, None].expand(E, N, 1)
        if c.use_full_observation:
            j = self.others.expand(E, N, N - 1)
        else:
            d2 = (s["x"][:, None, :] - s["x"][:, :, None]) ** 2 + (
                s["y"][:, None, :] - s["y"][:, :, None]
            ) ** 2
            excluded = ~live[:, None, :] | torch.eye(N, dtype=torch.bool, device=self.device)
            d2 = d2.masked_fill(excluded, float("inf"))
            order = torch.sort(d2, dim=-1, stable=True).indices[..., : c.num_other_agents_observed]
            present = torch.gather(d2, -1, order).isfinite()  # padding when too few in game
            j = order
        other_live = torch.gather(live[:, None, :].expand(E, N, N), -1, j)
        feats = []
        for v, sc in zip(values, scale, strict=True):
            rel = (torch.gather(v[:, None, :].expand(E, N, N), -1, j) - v[..., None]) / np.float32(
                sc
            )
            feats.append(rel * other_live)
        feats.append(self.types[j].float())
        feats.append(other_live.float())
        obs = torch.cat([*feats, t], -1)
        if not c.use_full_observation:
            mask = torch.cat([present.float()] * 7 + [torch.ones(E, N, 1, device=self.device)], -1)
            obs = obs * mask * live[..., None]  # all zeros for an agent out of the game
        return obs


def _draw_arena(taggers, runners, out, length: float, t: int) -> np.ndarray:
    """A frame of a Tag game: taggers red, runners blue, tagged runners grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3.2, 3.2), dpi=80)
    for points, color in ((out, "0.7"), (runners, "tab:blue"), (taggers, "tab:red")):
        if len(points):
            ax.scatter(points[:, 0], points[:, 1], s=30, c=color)
    ax.set_xlim(-0.5, length + 0.5)
    ax.set_ylim(-0.5, length + 0.5)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"t = {t}", fontsize=9)
    fig.canvas.draw()
    frame = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return frame
