"""Environments that live on a torch device (WarpDrive's design, with torch instead of CUDA C).

A :class:`DeviceEnv` steps ``num_envs`` games of ``num_agents`` agents at once. Its state is a
dict of tensors ``[num_envs, ...]`` allocated once; ``reset()`` and ``step(actions)`` update
them, and the observation, reward and flag buffers, in place with vectorised torch ops. Those
buffers are the data store: a trainer reads ``obs`` / ``reward`` / ``terminated`` /
``truncated`` and passes actions without any host-device copy (nothing in ``step`` reads a
tensor back to the host, so CUDA kernels queue up without synchronising).

Next-step autoreset (DESIGN.md): a game whose previous step ended it is reset by this step
instead: its action is ignored, it gets a new start state, reward 0 and both flags false. Start
states are drawn on the device from the environment's seeded generator (fresh per game and per
episode), or, with ``fixed_start``, every game restarts from the first state drawn (WarpDrive's
behaviour).

With ``cuda_graph``, the first ``step`` on a CUDA device records one step as a CUDA graph and
every later step replays it. A game step is a few dozen small kernels, and launching them one by
one bounds small games by launch time (WarpDrive writes a step as one CUDA kernel; a graph gets
torch's ops close to that without writing CUDA). The replay draws the same random numbers as
the eager step, so both give the same games.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


class DeviceEnv(ABC):
    """Subclasses set ``num_agents``, ``obs_dim``, ``action_nvec`` (one entry: ``Discrete(n)``
    actions ``[E, N]``; several: multi-discrete ``[E, N, len(nvec)]``) and implement
    ``_start_state``, ``_transition``, ``_observe``, ``reference`` and ``agent_names``."""

    num_agents: int
    obs_dim: int
    action_nvec: tuple[int, ...]

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        fixed_start: bool = False,
        cuda_graph: bool = False,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs, self.device, self.fixed_start = num_envs, torch.device(device), fixed_start
        if cuda_graph and self.device.type != "cuda":
            raise ValueError(f"cuda_graph needs a CUDA device, got {self.device}")
        self.cuda_graph = cuda_graph
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_actions: torch.Tensor | None = None  # the actions the graph reads
        self.generator = torch.Generator(self.device).manual_seed(seed)
        E, N = num_envs, self.num_agents
        self.obs = torch.zeros(E, N, self.obs_dim, device=self.device)
        self.reward = torch.zeros(E, N, device=self.device)
        self.terminated = torch.zeros(E, dtype=torch.bool, device=self.device)
        self.truncated = torch.zeros(E, dtype=torch.bool, device=self.device)
        self.tags = torch.zeros(E, device=self.device)  # Tag: tags in each game's last step
        self.state: dict[str, torch.Tensor] = {}
        self._first_start: dict[str, torch.Tensor] | None = None

    # ---------------------------------------------------------------- subclass interface
    @abstractmethod
    def _start_state(self) -> dict[str, torch.Tensor]:
        """A fresh start state for every game (drawn from ``self.generator``)."""

    @abstractmethod
    def _transition(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Advance every game in ``self.state`` (in place); return ``(reward [E, N],
        terminated [E], truncated [E])``. Games that are resetting are overwritten after."""

    @abstractmethod
    def _observe(self) -> torch.Tensor:
        """Observations ``[E, N, obs_dim]`` of the current state."""

    @abstractmethod
    def reference(self):
        """A reference (numpy) instance of one game with the same configuration."""

    @property
    @abstractmethod
    def agent_names(self) -> list[str]:
        """The reference's agent names, in agent-index order."""

    def policy_groups(self) -> dict[str, list[int]]:
        """Agent ids per policy (WarpDrive's ``policy_tag_to_agent_id_map``); default: one."""
        return {"agent": list(range(self.num_agents))}

    def render(self, i: int = 0) -> np.ndarray:
        """An RGB frame of game ``i``."""
        raise NotImplementedError(f"{type(self).__name__} cannot render")

    @property
    def action_shape(self) -> tuple[int, ...]:
        """``[E, N]`` for discrete actions, ``[E, N, heads]`` for multi-discrete ones."""
        heads = (len(self.action_nvec),) if len(self.action_nvec) > 1 else ()
        return (self.num_envs, self.num_agents, *heads)

    # ---------------------------------------------------------------- the data store
    def _draw_start(self, renew: bool = False) -> dict[str, torch.Tensor]:
        start = self._start_state()
        if self.fixed_start:
            if renew or self._first_start is None:
                self._first_start = self._written_into(self._first_start, start)
            start = self._first_start
        return start

    def _written_into(
        self, target: dict[str, torch.Tensor] | None, source: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """``source``'s values written into ``target``'s tensors where it has them all (a
        recorded CUDA graph reads those very tensors), else copied onto the device."""
        if target and target.keys() == source.keys():
            for k, v in source.items():
                target[k].copy_(v)
            return target
        return {k: v.to(self.device, copy=True) for k, v in source.items()}

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start every game; returns the observation buffer."""
        if seed is not None:
            self.generator.manual_seed(seed)
        self.state = self._written_into(self.state, self._draw_start(renew=seed is not None))
        self.reward.zero_()
        self.tags.zero_()
        self.terminated.zero_()
        self.truncated.zero_()
        self.obs.copy_(self._observe())
        return self.obs

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One step of every game; returns the ``obs, reward, terminated, truncated`` buffers."""
        if not self.state:
            raise RuntimeError("call reset() before step()")
        if tuple(actions.shape) != self.action_shape:
            raise ValueError(
                f"actions must have shape {self.action_shape}, got {tuple(actions.shape)}"
            )
        if not self.cuda_graph:
            self._step(actions.to(self.device))
        else:
            if self._graph is None:
                self._capture(actions)
            self._graph_actions.copy_(actions, non_blocking=True)
            self._graph.replay()
        return self.obs, self.reward, self.terminated, self.truncated

    def _step(self, actions: torch.Tensor) -> None:
        """The step itself, written into the buffers (the part a CUDA graph records)."""
        resetting = self.terminated | self.truncated
        reward, terminated, truncated = self._transition(actions)
        start = self._draw_start()
        for k, v in self.state.items():  # branch-free: no host sync to ask whether any reset
            mask = resetting.view(-1, *([1] * (v.dim() - 1)))
            v.copy_(torch.where(mask, start[k], v))
        self.reward.copy_(torch.where(resetting[:, None], 0.0, reward))
        self.tags.masked_fill_(resetting, 0.0)
        self.terminated.copy_(terminated & ~resetting)
        self.truncated.copy_(truncated & ~resetting)
        self.obs.copy_(self._observe())

    def _capture(self, actions: torch.Tensor) -> None:
        """Record ``_step`` as a CUDA graph. Warm-up steps on a side stream come first (lazy
        initialisations must not happen inside a capture), then the games are put back as they
        were, in place: the graph reads and writes these very tensors."""
        self._graph_actions = actions.to(self.device).clone()
        before = self.state_dict()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                self._step(self._graph_actions)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.load_state_dict(before)
        self._graph = record_graph(lambda: self._step(self._graph_actions), self.device,
                                   [self.generator], torch.cuda.Stream(self.device), None,
                                   self.kept_tensors)  # fmt: skip

    def kept_tensors(self) -> list[torch.Tensor]:
        """The tensors that outlive a step (the games' state and the data store), which a
        recorded step reads and writes."""
        return [*self.state.values(), *(getattr(self, k) for k in self._BUFFERS)]

    def game_state(self, i: int) -> dict[str, np.ndarray]:
        """Game ``i``'s state on the host, as its reference holds it (for the consistency
        checker and rendering); fields named ``_...`` are device bookkeeping and left out."""
        return {k: v[i].cpu().numpy() for k, v in self.state.items() if not k.startswith("_")}

    _BUFFERS = ("obs", "reward", "terminated", "truncated", "tags")

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: game states, buffers, the generator."""
        return dict(
            state={k: v.clone() for k, v in self.state.items()},
            buffers={k: getattr(self, k).clone() for k in self._BUFFERS},
            generator=self.generator.get_state(),
            first_start=None if self._first_start is None else {
                k: v.clone() for k, v in self._first_start.items()
            },
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = self._written_into(self.state, state["state"])
        for k, v in state["buffers"].items():
            getattr(self, k).copy_(v)
        self.generator.set_state(state["generator"])
        if state["first_start"] is not None:
            self._first_start = self._written_into(self._first_start, state["first_start"])

    def sample_actions(self, rng: np.random.Generator) -> np.ndarray:
        """Uniform random actions for every agent of every game (host side, for checks)."""
        shape = (self.num_envs, self.num_agents)
        if len(self.action_nvec) == 1:
            return rng.integers(self.action_nvec[0], size=shape)
        return np.stack([rng.integers(n, size=shape) for n in self.action_nvec], -1)


def record_graph(
    step: Callable[[], object],
    device: torch.device,
    generators: Sequence[torch.Generator],
    stream: torch.cuda.Stream,
    pool: Any,
    kept: Callable[[], list[torch.Tensor]],
) -> torch.cuda.CUDAGraph:
    """``step`` recorded as a CUDA graph on ``device`` (on ``stream``, its scratch memory from
    ``pool`` if given): its Python runs once, its kernels are recorded, not run. A replay reads
    and writes the very tensors the recording saw, so ``step`` must write into the tensors that
    outlive it (``kept()``), never replace them: a replaced one is refused here, since a replay
    would go on reading the old one. The ``generators`` are registered with the graph, so each
    replay draws what the eager step would and advances them as it would."""
    before = [t.data_ptr() for t in kept()]
    graph = torch.cuda.CUDAGraph()
    for generator in generators:
        graph.register_generator_state(generator)
    try:
        with torch.cuda.device(device), torch.cuda.graph(graph, pool=pool, stream=stream):
            step()
    except RuntimeError as e:
        raise RuntimeError(
            "this step cannot be recorded as a CUDA graph (nothing in it may read a tensor back "
            f"to the host: no .item(), no branch on a tensor's value); turn cuda_graph off: {e}"
        ) from e
    if [t.data_ptr() for t in kept()] != before:
        raise RuntimeError(
            "the recorded step replaced a tensor it should write into (self.state[k] = ... in "
            "place of self.state[k].copy_(...)), which a replay would not see; write in place, "
            "or turn cuda_graph off"
        )
    return graph
