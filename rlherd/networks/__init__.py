"""Network building blocks: torsos that embed observations, an LSTM core, policy/value heads.

Torsos take observations of shape ``[N, *obs_shape]`` and return ``[N, out_dim]`` features;
image torsos accept uint8 frames and scale them to [0, 1] themselves, so actors can ship the
compact uint8 observations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from rlherd.core import EnvSpec
from rlherd.errors import ConfigError

__all__ = [
    "MLPTorso",
    "AtariShallowTorso",
    "ImpalaResNetTorso",
    "MinAtarTorso",
    "LSTMCore",
    "make_torso",
    "require_discrete",
    "PRECISIONS",
    "autocast",
    "ObservationConfig",
    "torso_of",
]


def _frames(obs: torch.Tensor) -> torch.Tensor:
    """Frames ``[N, C, H, W]`` as floats in [0, 1] (uint8 scaled, floats as they are), laid out
    channels-last in passes that will be differentiated on a CPU.

    Why: oneDNN, which runs PyTorch's CPU convolutions, computes in channels-last and otherwise
    reorders activations and their gradients into it and back. Forward and backward over a
    learner's batch, one core of a 2-core AMD EPYC (torch 2.13): 1.35x faster for the shallow
    Atari network (162 frames), 1.7x for the deep one (64 frames). Passes without gradients
    (acting, target networks) keep PyTorch's layout: there channels-last measured the same to
    1.4x slower (1 to 128 frames). MinAtar's 10x10 grids gain nothing either way, so its torso
    does not call this. The numbers are the same up to float rounding."""
    if obs.device.type == "cpu" and torch.is_grad_enabled():
        obs = obs.contiguous(memory_format=torch.channels_last)  # before the float copy: 4x less
    return obs.float() / 255.0 if obs.dtype == torch.uint8 else obs.float()


ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


class MLPTorso(nn.Module):
    """Fully connected layers (ReLU, or tanh as PPO often uses) for vector observations
    (flattened)."""

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        hidden: tuple[int, ...] = (64, 64),
        activation: str = "relu",
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {activation!r}; choose one of {list(ACTIVATIONS)}"
            )
        layers: list[nn.Module] = []
        size = int(torch.tensor(obs_shape).prod()) if obs_shape else 1
        for h in hidden:
            layers += [nn.Linear(size, h), ACTIVATIONS[activation]()]
            size = h
        self.net = nn.Sequential(*layers)
        self.out_dim = size

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float().flatten(1))


class AtariShallowTorso(nn.Module):
    """The IMPALA "shallow" network (TorchBeast's AtariNet): three convolutions and a 512 fc.

    Nature-DQN convolutions 32x8x8/4, 64x4x4/2, 64x3x3/1 for ``[C, 84, 84]`` frames.
    """

    def __init__(self, obs_shape: tuple[int, int, int], fc: int = 512):
        super().__init__()
        c, h, w = obs_shape
        self.convs = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )  # fmt: skip
        with torch.no_grad():
            n = self.convs(torch.zeros(1, c, h, w)).shape[1]
        self.fc = nn.Sequential(nn.Linear(n, fc), nn.ReLU())
        self.out_dim = fc

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(_frames(obs)))


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaResNetTorso(nn.Module):
    """The IMPALA "deep" network: three sections (16, 32, 32 channels) and a 256 fc.

    Each section is a 3x3 convolution, a 3x3 max-pool with stride 2 and two residual blocks
    (Espeholt et al. 2018, figure 3).
    """

    def __init__(
        self,
        obs_shape: tuple[int, int, int],
        channels: tuple[int, ...] = (16, 32, 32),
        fc: int = 256,
    ):
        super().__init__()
        c, h, w = obs_shape
        sections: list[nn.Module] = []
        for out in channels:
            sections += [
                nn.Conv2d(c, out, 3, padding=1),
                nn.MaxPool2d(3, stride=2, padding=1),
                _ResidualBlock(out),
                _ResidualBlock(out),
            ]
            c = out
        self.convs = nn.Sequential(*sections, nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            n = self.convs(torch.zeros(1, *obs_shape)).shape[1]
        self.fc = nn.Sequential(nn.Linear(n, fc), nn.ReLU())
        self.out_dim = fc

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(_frames(obs)))


class MinAtarTorso(nn.Module):
    """The MinAtar paper's network: one 16x3x3 convolution and a 128 fc (Young & Tian 2019)."""

    def __init__(self, obs_shape: tuple[int, int, int], fc: int = 128):
        super().__init__()
        c, h, w = obs_shape
        self.conv = nn.Sequential(nn.Conv2d(c, 16, 3, stride=1), nn.ReLU(), nn.Flatten())
        self.fc = nn.Sequential(nn.Linear(16 * (h - 2) * (w - 2), fc), nn.ReLU())
        self.out_dim = fc

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(obs.float()))


TORSOS = ("auto", "mlp", "shallow", "deep", "minatar", "nethack")
PRECISIONS = ("float32", "bfloat16")


def autocast(device_type: str, precision: str) -> torch.autocast:
    """The context a torso runs in: ``"bfloat16"`` runs its convolutions and matrix products in
    bfloat16 (``torch.autocast``; weights, gradients and optimiser stay float32), ``"float32"``
    changes nothing. Callers hand what follows (heads, losses) float32 features.

    bfloat16 is about 2.5x faster for IMPALA's Atari torso on CPUs that compute in it natively
    (AVX512-BF16 or AMX: AMD Zen 4, Intel Sapphire Rapids and later) and on GPUs; elsewhere
    PyTorch emulates it, slowly."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bfloat16")


def require_discrete(spec: EnvSpec, agent: str) -> None:
    """Agents with categorical policies or Q-values fail early, naming the space."""
    if spec.action_kind != "discrete":
        raise ConfigError(
            f"{agent} acts in Discrete action spaces; {spec.env_id} has {spec.action_kind} "
            f"actions of shape {spec.action_shape}; use ppo, which acts in every space, or "
            "sac, td3, d4pg, ddpg, mpo or dmpo for continuous actions."
        )


def require_discrete_or_box(spec: EnvSpec, agent: str) -> None:
    """The offline agents that learn either kind of action (BC, CQL) fail early on the others,
    MultiBinary's included (read as MultiDiscrete), with the two ways on: an online agent, or
    the actions numbered as one Discrete before the dataset is recorded."""
    if spec.action_kind in ("discrete", "continuous"):
        return
    choices = math.prod(spec.action_nvec)
    raise ConfigError(
        f"{agent} learns Discrete or Box actions; {spec.env_id} has MultiDiscrete (or "
        f"MultiBinary) actions of shape {spec.action_shape}, which no offline agent learns: "
        f"train ppo online, or number them as one Discrete({choices}) in a "
        "gymnasium.ActionWrapper and record the dataset through it"
    )


def make_torso(
    spec: EnvSpec,
    kind: str = "auto",
    hidden: tuple[int, ...] = (64, 64),
    obs_keys: tuple[str, ...] = (),
    obs_encoders: dict[str, str] | None = None,
) -> nn.Module:
    """Pick a torso for ``spec``: ``auto`` is ``shallow`` for Atari-sized frames, ``minatar`` for
    small grids and ``mlp`` for vectors.

    A dict observation is read by a :class:`~rlherd.networks.encoders.MultiInputTorso`
    (``auto`` or ``mlp``; ``obs_keys`` selects its arrays and ``obs_encoders`` overrides how
    each is read) or by NetHack's baseline network (``nethack``)."""
    # Imported here: the encoders build on the torsos of this module.
    from rlherd.networks.encoders import MultiInputTorso, NetHackTorso

    if kind not in TORSOS:
        raise ConfigError(f"unknown torso {kind!r}; choose one of {', '.join(TORSOS)}")
    if spec.structured:
        if kind in ("auto", "mlp"):
            return MultiInputTorso(spec.obs, hidden, obs_encoders, obs_keys)
        if kind == "nethack" and (obs_keys or obs_encoders):
            raise ConfigError(
                "torso 'nethack' reads glyphs and blstats its own way; obs_keys and obs_encoders "
                "apply to torso auto or mlp"
            )
        if kind == "nethack":
            return NetHackTorso(spec.obs)
        raise ConfigError(
            f"torso {kind!r} reads one array; {spec.env_id} observes a dict of arrays "
            f"({', '.join(spec.obs)}); choose torso auto, mlp or nethack"
        )
    refuse_dict_options(spec, obs_keys, obs_encoders)
    if kind == "nethack":
        raise ConfigError(
            f"torso 'nethack' reads NetHack's dict of glyphs and blstats; {spec.env_id} "
            f"observes one array of shape {spec.obs_shape}"
        )
    shape = spec.obs_shape
    last = spec.is_image and channels_last(shape)
    chw = (shape[2], shape[0], shape[1]) if last else shape
    if kind == "auto":
        kind = "mlp" if not spec.is_image else ("shallow" if chw[1] >= 36 else "minatar")
    if kind == "mlp":
        return MLPTorso(shape, hidden)
    if not spec.is_image:
        raise ConfigError(f"torso {kind!r} needs image observations, not {shape}")
    torso = {"shallow": AtariShallowTorso, "deep": ImpalaResNetTorso, "minatar": MinAtarTorso}[kind]
    return ChannelsLast(torso(chw)) if last else torso(chw)


def channels_last(shape: tuple[int, ...]) -> bool:
    """Whether an image of ``shape`` (three sides) is laid out channels-last: its last side is
    its shortest (a ``(64, 64, 3)`` render, MiniGrid's ``(7, 7, 3)``, a ``(84, 84, 4)`` stack),
    as images of one's own often are; any other (``(4, 84, 84)``, MinAtar's ``(10, 10, 10)``)
    is channels-first, as rlherd's image torsos read them."""
    return shape[2] < min(shape[0], shape[1])


class ChannelsLast(nn.Module):
    """An image torso made for channels-first frames reading channels-last ones: each batch
    ``[N, H, W, C]`` is viewed as ``[N, C, H, W]`` (a permute, no copy) before it."""

    def __init__(self, torso: nn.Module):
        super().__init__()
        self.torso, self.out_dim = torso, torso.out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.torso(x.permute(0, 3, 1, 2))


class LSTMCore(nn.Module):
    """An LSTM over time that zeroes its state at episode starts.

    ``forward(x [T, B, D], first [T, B], state)``: before reading row ``t`` the state of every
    environment with ``first[t]`` true is reset to zeros, so one unroll can span episodes.
    """

    def __init__(self, input_dim: int, hidden: int = 256, layers: int = 1):
        super().__init__()
        self.lstm = nn.LSTM(input_dim, hidden, num_layers=layers)
        self.out_dim = hidden

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (self.lstm.num_layers, batch_size, self.lstm.hidden_size)
        device = self.lstm.weight_ih_l0.device
        return torch.zeros(shape, device=device), torch.zeros(shape, device=device)

    def forward(
        self,
        x: torch.Tensor,
        first: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        outputs = []
        keep = (~first).float()[:, None, :, None]  # [T, 1, B, 1] broadcasts over layers and H
        h, c = state
        for t in range(x.shape[0]):
            h, c = h * keep[t], c * keep[t]
            out, (h, c) = self.lstm(x[t : t + 1], (h, c))
            outputs.append(out)
        return torch.cat(outputs), (h, c)


def refuse_dict_options(spec: EnvSpec, obs_keys: tuple, obs_encoders: dict | None) -> None:
    """``obs_keys`` and ``obs_encoders`` given for an environment that observes one array."""
    if obs_keys or obs_encoders:
        raise ConfigError(
            f"{spec.env_id}: this environment observes one array; obs_keys and obs_encoders "
            "apply to dict observations"
        )


@dataclass
class ObservationConfig:
    """The config fields of agents that read dict observations (a mixin of their configs).

    ``obs_keys``: the observation's keys to read (empty: every array); ``obs_encoders``: an
    encoder per key overriding the automatic choice (``cnn``, ``embed``, ``onehot``, ``flat``,
    ``skip``; see :mod:`rlherd.networks.encoders`), e.g.
    ``--set 'obs_encoders={"image": "flat"}'``. Setting either for an environment that
    observes one array is an error.
    """

    obs_keys: tuple[str, ...] = ()
    obs_encoders: dict[str, str] = field(default_factory=dict)


def torso_of(spec: EnvSpec, config: ObservationConfig) -> nn.Module:
    """The torso an agent's config asks for: :func:`make_torso` with its ``torso``,
    ``hidden_sizes``, ``obs_keys`` and ``obs_encoders`` fields."""
    try:
        return make_torso(spec, config.torso, tuple(config.hidden_sizes),
                          tuple(config.obs_keys), dict(config.obs_encoders))  # fmt: skip
    except RuntimeError as e:  # torch.OutOfMemoryError, on a device, is one too
        if "can't allocate memory" not in str(e) and not isinstance(e, torch.OutOfMemoryError):
            raise
        raise ConfigError(f"hidden_sizes {list(config.hidden_sizes)}: the torso's layers need "
                          "more memory than there is; choose smaller sizes") from None
