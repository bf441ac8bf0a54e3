"""Networks for off-policy continuous control (DDPG, D4PG, MPO, DMPO), after Acme's.

Policies and critics work in the canonical action box ``[-1, 1]^D``: :class:`ActorCritic` maps
to and from the environment's bounds (:meth:`ActorCritic.to_env`, :meth:`~ActorCritic.from_env`),
so replay holds the actions the environments took and a learner rescales them once per batch.

- :class:`LayerNormMLP`: Acme's torso: ``Linear -> LayerNorm -> tanh`` then ``Linear -> ELU``
  layers; the normalised first layer keeps very different observation scales trainable without
  normalising observations. :func:`torso` gives it, or (``layer_norm=False``) the plain ReLU MLP
  of SAC's and TD3's papers and reference code.
- :class:`ObsVector`: the observation as one float vector, codes one-hot; every policy and
  critic here reads through one.
- :class:`DeterministicPolicy`: ``tanh`` of a linear head (D4PG, DDPG, TD3), near-zero at the
  start as Acme's, or initialised as PyTorch's default (``near_zero_head=False``, TD3's code).
- :class:`GaussianPolicy`: a diagonal Gaussian with an untransformed mean and a softplus scale
  starting at ``init_scale`` (MPO, DMPO); samples are clipped to the box when acted.
- :class:`TanhGaussianPolicy`: a Gaussian squashed by ``tanh`` into the box (SAC, CQL), with
  :func:`tanh_gaussian_sample` and :func:`tanh_gaussian_log_prob`.
- :class:`Critic`: ``Q(s, a)`` as one value, or as logits over fixed ``atoms`` (a categorical
  distributional critic, ``num_atoms > 1``).
- :class:`SACNetworks`: SAC's actor-critic, a tanh-Gaussian policy and twin critics (SAC's, and
  CQL's for continuous actions); :class:`TD3Networks`: a deterministic policy and twin critics.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as nnf
from torch import nn

from rlherd import types as F
from rlherd.core import EnvSpec
from rlherd.errors import ConfigError


class LayerNormMLP(nn.Module):
    """``Linear -> LayerNorm -> tanh``, then ``Linear -> ELU`` for each further size (the last
    one without its ELU unless ``activate_final``): Acme's ``LayerNormMLP``."""

    def __init__(self, in_dim: int, sizes: tuple[int, ...], activate_final: bool = True):
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(in_dim, sizes[0]), nn.LayerNorm(sizes[0]), nn.Tanh()]
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            layers.append(nn.Linear(a, b))
            if activate_final or i < len(sizes) - 2:
                layers.append(nn.ELU())
        self.net = nn.Sequential(*layers)
        self.out_dim = sizes[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def torso(in_dim: int, sizes: tuple[int, ...], layer_norm: bool = True) -> nn.Module:
    """Acme's :class:`LayerNormMLP`, or (``layer_norm=False``) ``Linear -> ReLU`` layers, the
    networks of the SAC and TD3 papers' code (and Stable-Baselines3's); both have ``out_dim``."""
    if layer_norm:
        return LayerNormMLP(in_dim, sizes)
    layers: list[nn.Module] = []
    for a, b in zip((in_dim, *sizes[:-1]), sizes, strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    net = nn.Sequential(*layers)
    net.out_dim = sizes[-1]
    return net


def near_zero_linear(in_dim: int, out_dim: int, scale: float = 1e-4) -> nn.Linear:
    """A linear layer whose initial outputs are nearly zero (Acme's ``NearZeroInitializedLinear``):
    a fresh policy acts near the middle of the box and a fresh critic predicts near zero."""
    layer = nn.Linear(in_dim, out_dim)
    nn.init.trunc_normal_(layer.weight, std=math.sqrt(scale / in_dim))
    nn.init.zeros_(layer.bias)
    return layer


def output_layer(in_dim: int, out_dim: int, near_zero: bool) -> nn.Linear:
    """An output layer: :func:`near_zero_linear` (Acme's networks), or PyTorch's default
    initialisation, which the TD3 authors' code and Stable-Baselines3 keep."""
    return near_zero_linear(in_dim, out_dim) if near_zero else nn.Linear(in_dim, out_dim)


class ObsVector(nn.Module):
    """Reads an observation as the float vectors ``[*leading, D]`` these networks take: an
    array reshaped, a dict observation's arrays (its action mask aside) reshaped and joined in
    key order (goal-conditioned tasks: observation, achieved and desired goal), and codes
    (``Discrete`` and ``MultiDiscrete`` leaves) one-hot, so that an MLP reads category 2 as a
    category of its own rather than as twice category 1. ``out_dim`` is ``D``; it has no
    parameters, so one instance serves a policy and its critics."""

    def __init__(self, spec: EnvSpec):
        super().__init__()
        leaves = spec.obs if spec.structured else {"": spec.obs}
        images = [k or "the observation" for k, leaf in leaves.items() if len(leaf.shape) == 3]
        if images:
            raise ConfigError(
                f"{spec.env_id} has image observations ({', '.join(images)}); the "
                "continuous-control agents take vector observations (state-based tasks such as "
                "Pendulum-v1, HalfCheetah-v5 or dm_control/cartpole-swingup-v0): train ppo, "
                "whose networks read images in every action space"
            )
        # Key -> categories of its codes (0: numbers, read as they are).
        self.categories = {k: leaves[k].categories if leaves[k].kind == "discrete" else 0
                           for k in sorted(leaves) if k != F.ACTION_MASK}  # fmt: skip
        self.out_dim = sum(math.prod(leaves[k].shape) * max(n, 1)
                           for k, n in self.categories.items())  # fmt: skip

    def forward(self, obs: torch.Tensor | dict[str, torch.Tensor], *leading: int) -> torch.Tensor:
        arrays = obs if isinstance(obs, dict) else {"": obs}
        codes = {k: nnf.one_hot(arrays[k].long(), n) for k, n in self.categories.items() if n}
        parts = [codes.get(k, arrays[k]).float().reshape(*leading, -1) for k in self.categories]
        return parts[0] if len(parts) == 1 else torch.cat(parts, -1)  # one array: no copy


def require_bounded_box(spec: EnvSpec, agent: str) -> None:
    """Continuous-control agents act in a bounded box, which they rescale to ``[-1, 1]``."""
    if spec.action_kind != "continuous":
        # dqn and impala act in Discrete spaces only: ppo alone in MultiDiscrete ones.
        instead = "ppo" if spec.action_kind == "multidiscrete" else "dqn, impala or ppo"
        raise ConfigError(
            f"{agent} acts in continuous (Box) action spaces; {spec.env_id} has "
            f"{spec.action_kind} actions; use {instead}"
        )
    if not (np.isfinite(spec.action_low).all() and np.isfinite(spec.action_high).all()):
        raise ConfigError(
            f"{agent} needs finite action bounds to rescale actions to [-1, 1]; {spec.env_id}'s "
            f"are {spec.action_low} .. {spec.action_high}; use ppo, whose Gaussian policy acts "
            "in unbounded boxes"
        )


class DeterministicPolicy(nn.Module):
    """``obs [B, ...] -> action [B, D]`` in ``[-1, 1]``."""

    def __init__(self, read: ObsVector, action_dim: int, sizes: tuple[int, ...],
                 layer_norm: bool = True, near_zero_head: bool = True):  # fmt: skip
        super().__init__()
        self.read = read
        self.torso = torso(read.out_dim, sizes, layer_norm)
        self.head = output_layer(self.torso.out_dim, action_dim, near_zero_head)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.head(self.torso(self.read(obs, F.obs_len(obs)))))


class GaussianPolicy(nn.Module):
    """``obs [B, ...] -> (mean [B, D], std [B, D])``: Acme's ``MultivariateNormalDiagHead``, with
    ``std = softplus(x) * init_scale / softplus(0) + min_scale`` (``init_scale`` at the start)."""

    def __init__(
        self,
        read: ObsVector,
        action_dim: int,
        sizes: tuple[int, ...],
        init_scale: float = 0.7,
        min_scale: float = 1e-6,
    ):
        super().__init__()
        self.read = read
        self.torso = LayerNormMLP(read.out_dim, sizes)
        self.mean = near_zero_linear(self.torso.out_dim, action_dim)
        self.scale = near_zero_linear(self.torso.out_dim, action_dim)
        self.init_scale, self.min_scale = init_scale, min_scale

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.torso(self.read(obs, F.obs_len(obs)))
        std = nnf.softplus(self.scale(x)) * (self.init_scale / math.log(2.0)) + self.min_scale
        return self.mean(x), std


class TanhGaussianPolicy(nn.Module):
    """``obs [B, ...] -> (mean [B, D], log_std [B, D])`` of a Gaussian whose samples ``tanh``
    squashes into the canonical box (SAC's policy, Haarnoja et al. 2018); ``log_std`` is clipped
    to ``[-20, 2]`` as SAC's code does."""

    def __init__(self, read: ObsVector, action_dim: int, sizes: tuple[int, ...],
                 layer_norm: bool = True, near_zero_head: bool = True):  # fmt: skip
        super().__init__()
        self.read = read
        self.torso = torso(read.out_dim, sizes, layer_norm)
        self.mean = output_layer(self.torso.out_dim, action_dim, near_zero_head)
        self.log_std = output_layer(self.torso.out_dim, action_dim, near_zero_head)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.torso(self.read(obs, F.obs_len(obs)))
        return self.mean(x), self.log_std(x).clamp(-20.0, 2.0)


def _squashed_log_prob(mean, log_std, u: torch.Tensor) -> torch.Tensor:
    """``log p(tanh(u))`` for ``u ~ N(mean, exp(log_std))``, summed over action dimensions:
    the Gaussian's density less ``log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))``."""
    gaussian = torch.distributions.Normal(mean, log_std.exp()).log_prob(u)
    return (gaussian - 2.0 * (math.log(2.0) - u - nnf.softplus(-2.0 * u))).sum(-1)


def tanh_gaussian_sample(mean: torch.Tensor, log_std: torch.Tensor, n: int | None = None):
    """Reparameterised samples and their log-densities: ``([B, D], [B])``, or ``([n, B, D],
    [n, B])``."""
    shape = mean.shape if n is None else (n, *mean.shape)
    u = mean + log_std.exp() * torch.randn(shape, device=mean.device)
    return torch.tanh(u), _squashed_log_prob(mean, log_std, u)


def tanh_gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor):
    """The log-density of given actions in the box (a dataset's), kept off its edges."""
    u = torch.atanh(action.clamp(-1.0 + 1e-6, 1.0 - 1e-6))
    return _squashed_log_prob(mean, log_std, u)


class Critic(nn.Module):
    """``(obs [..., *obs_shape], action [..., D]) -> value [...]`` (same leading dimensions),
    or ``logits [..., N]`` with ``num_atoms = N > 1``; then ``atoms [N]``, evenly spaced over
    ``[vmin, vmax]``, is a buffer: a learner may place the support once it has seen the task's
    rewards. Actions are clipped to the box first, as the environments clip them (Acme's
    ``ClipToSpec``)."""

    def __init__(
        self,
        read: ObsVector,
        action_dim: int,
        sizes: tuple[int, ...],
        num_atoms: int = 1,
        vmin: float = -150.0,
        vmax: float = 150.0,
        layer_norm: bool = True,
        near_zero_head: bool = True,
    ):
        super().__init__()
        self.read = read
        self.torso = torso(read.out_dim + action_dim, sizes, layer_norm)
        self.head = output_layer(self.torso.out_dim, num_atoms, near_zero_head)
        self.num_atoms = num_atoms
        if num_atoms > 1:
            self.register_buffer("atoms", torch.linspace(vmin, vmax, num_atoms))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        obs = self.read(obs, *action.shape[:-1])
        x = self.head(self.torso(torch.cat([obs, action.clamp(-1.0, 1.0)], -1)))
        return x if self.num_atoms > 1 else x[..., 0]

    def set_support(self, vmin: float, vmax: float) -> None:
        """Place the atoms evenly over ``[vmin, vmax]`` (in place, so copies follow)."""
        with torch.no_grad():
            self.atoms.copy_(torch.linspace(vmin, vmax, self.num_atoms))


def make_critic(spec: EnvSpec, config: Any) -> Critic:
    """The critic a config describes (``critic_sizes``; ``distributional`` over ``num_atoms``
    on ``[vmin, vmax]``). A derived support (no ``vmin`` / ``vmax``) starts at +-1; the learner
    places it at its first batch."""
    atoms = config.num_atoms if config.distributional else 1
    vmin, vmax = (config.vmin, config.vmax) if config.vmin is not None else (-1.0, 1.0)
    return Critic(ObsVector(spec), spec.action_shape[0], tuple(config.critic_sizes), atoms, vmin,
                  vmax)  # fmt: skip


class ActionBounds:
    """For a network that keeps the environment's action bounds as buffers (so every copy of it
    rescales alike): call :meth:`register_bounds` in ``__init__``."""

    action_low: torch.Tensor
    action_high: torch.Tensor

    def register_bounds(self, spec: EnvSpec) -> None:
        # Copies: a spec that came through Ray's object store holds read-only arrays.
        self.register_buffer("action_low", torch.tensor(spec.action_low, dtype=torch.float32))
        self.register_buffer("action_high", torch.tensor(spec.action_high, dtype=torch.float32))

    def to_env(self, action: torch.Tensor) -> torch.Tensor:
        """Canonical ``[-1, 1]`` actions (clipped) as the environment's."""
        half = (self.action_high - self.action_low) / 2
        return self.action_low + (action.clamp(-1.0, 1.0) + 1.0) * half

    def from_env(self, action: torch.Tensor) -> torch.Tensor:
        """The environment's actions in the canonical box."""
        half = (self.action_high - self.action_low) / 2
        return (action - self.action_low) / half - 1.0


class ActorCritic(ActionBounds, nn.Module):
    """A policy and a critic, and the environment's action bounds."""

    def __init__(self, spec: EnvSpec, policy: nn.Module, critic: Critic):
        super().__init__()
        self.policy, self.critic = policy, critic
        self.register_bounds(spec)


class TwinCritics(ActionBounds, nn.Module):
    """A ``policy`` and two critics, ``q1`` and ``q2`` (the smaller of the two is the target:
    clipped double Q, Fujimoto et al. 2018), from a config's ``policy_sizes``, ``critic_sizes``,
    ``layer_norm`` and ``near_zero_heads``; subclasses say which policy. ``learning``, a flag
    the learner sets at its first step, travels to the actors with the parameters: until then
    an agent that warms up acts at random (:class:`rlherd.agents.acting.WarmUpPolicy`)."""

    discrete = False
    policy_class: type[nn.Module]

    def __init__(self, spec: EnvSpec, config: Any, agent: str):
        super().__init__()
        require_bounded_box(spec, agent)
        read, actions, sizes = ObsVector(spec), spec.action_shape[0], tuple(config.policy_sizes)
        norm, near_zero = config.layer_norm, config.near_zero_heads
        self.policy = self.policy_class(read, actions, sizes, norm, near_zero)
        critic_sizes = tuple(config.critic_sizes)
        self.q1 = Critic(read, actions, critic_sizes, layer_norm=norm, near_zero_head=near_zero)
        self.q2 = Critic(read, actions, critic_sizes, layer_norm=norm, near_zero_head=near_zero)
        self.register_bounds(spec)
        # A float (0 or 1), as every other tensor here: one dtype keeps parameter copies fused.
        self.register_buffer("learning", torch.zeros(()))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        """Networks saved before the flag existed (CQL's) come from learners that had stepped."""
        state_dict.setdefault(prefix + "learning", torch.ones(()))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class SACNetworks(TwinCritics):
    """SAC's networks (Haarnoja et al., 2018): a tanh-Gaussian policy and twin critics."""

    policy_class = TanhGaussianPolicy


class TD3Networks(TwinCritics):
    """TD3's networks (Fujimoto et al., 2018): a deterministic policy and twin critics."""

    policy_class = DeterministicPolicy
