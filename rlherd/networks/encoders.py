"""Torsos for observations that are a dict of arrays (:attr:`rlherd.core.EnvSpec.structured`).

:class:`MultiInputTorso` reads each array with a part chosen from what the array holds (its
:class:`~rlherd.core.Leaf`): images through the existing image torsos, integer codes through
embeddings or one-hots, other numbers as they are; it concatenates the parts and puts an MLP on
top. :class:`NetHackTorso` is the NetHack Learning Environment's baseline network, which knows
where the hero stands and looks at a crop around it as well as at the whole map.
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlherd.core import Leaf
from rlherd.errors import ConfigError
from rlherd.networks import AtariShallowTorso, MinAtarTorso, MLPTorso, channels_last
from rlherd.types import ACTION_MASK

__all__ = ["ENCODERS", "auto_encoder", "MultiInputTorso", "NetHackTorso", "egocentric_crop"]

ENCODERS = ("cnn", "embed", "onehot", "flat", "skip")

# A one-hot is exact and has no parameters of its own, but its width is entries x categories:
# up to this many inputs it stays cheaper than an embedding's table and conv stack.
ONEHOT_LIMIT = 1024
# Width of the generic embedding of one code: NetHack's baseline uses 32 for its 5,976 glyphs;
# the generic part serves smaller vocabularies (MiniGrid objects, board cells) and stays lighter.
EMBED_DIM = 16
# Frames at least this large on both sides go through IMPALA's shallow Atari network (whose
# 8x8/4 first convolution needs 36 pixels to leave a 3x3 map for the last one); smaller grids
# through MinAtar's single 3x3 convolution. make_torso draws the same line for array images.
ATARI_MIN_SIZE = 36
# The conv stacks over grids of codes: NetHack's baseline's 16 filters, and 8 in the last layer
# so that the flattened grid stays small for the fully connected layer after it.
GRID_FILTERS = 16
GRID_OUT = 8


def auto_encoder(key: str, leaf: Leaf) -> str:
    """The part that reads ``leaf`` when nothing else is asked for (one of :data:`ENCODERS`).

    The action mask is left to the policy heads. Codes (discrete leaves, integer grids with a
    known number of categories) are one-hot when that stays small, embedded otherwise; 3-D boxes
    are images, and so are 2-D uint8 frames of Atari's size (a grayscale screen, not codes:
    NetHack's 21 x 79 character grid is a grid of codes); everything else is read as numbers.
    """
    if key == ACTION_MASK:
        return "skip"
    if leaf.kind == "discrete":
        return "onehot" if math.prod(leaf.shape) * leaf.categories <= ONEHOT_LIMIT else "embed"
    if leaf.kind == "binary":
        return "flat"
    if len(leaf.shape) == 3 or (_frame_2d(leaf) and min(leaf.shape) >= ATARI_MIN_SIZE):
        return "cnn"
    if len(leaf.shape) == 2 and leaf.categories > 0:
        return "embed"
    return "flat"


def _frame_2d(leaf: Leaf) -> bool:
    return len(leaf.shape) == 2 and leaf.dtype == np.uint8


def _check(key: str, leaf: Leaf, encoder: str) -> None:
    """Fail at construction, in one line, where torch would fail later and deep inside."""
    if encoder not in ENCODERS:
        raise ConfigError(
            f"unknown encoder {encoder!r} for observation key {key!r}; choose one of "
            f"{', '.join(ENCODERS)}"
        )
    if key == ACTION_MASK and encoder != "skip":
        raise ConfigError(
            f"{ACTION_MASK!r} is the legal-action mask, which the policy heads read; it cannot "
            f"be encoded as {encoder!r}"
        )
    if encoder == "cnn" and len(leaf.shape) not in (2, 3):
        raise ConfigError(
            f"encoder 'cnn' reads images (2 or 3 dimensions); observation key {key!r} has shape "
            f"{leaf.shape}"
        )
    if encoder in ("onehot", "embed") and leaf.categories == 0:
        raise ConfigError(
            f"encoder {encoder!r} reads codes with a known number of categories; observation key "
            f"{key!r} ({leaf.kind} {leaf.dtype} {leaf.shape}) has none; use 'flat'"
        )


def _conv_stack(in_channels: int, layers: int) -> nn.Sequential:
    """``layers`` 3x3 convolutions that keep the grid's size, each followed by an ELU, then
    flatten: NetHack's baseline stack, with ``GRID_OUT`` channels per cell at the end.

    The ELUs work in place (a convolution's backward pass does not need its output): 8% less
    time for NetHack's torso, forward and backward on one CPU core."""
    channels = [in_channels] + [GRID_FILTERS] * (layers - 1) + [GRID_OUT]
    modules: list[nn.Module] = []
    for cin, cout in pairwise(channels):
        modules += [nn.Conv2d(cin, cout, 3, padding=1), nn.ELU(inplace=True)]
    return nn.Sequential(*modules, nn.Flatten())


class _Image(nn.Module):
    """An image through an existing torso: a 2-D one as one channel; a 3-D one whose last side
    is its shortest (MiniGrid's ``(7, 7, 3)``, a ``(84, 84, 4)`` stack) is channels-last and is
    turned channels-first, any other (``(4, 84, 84)``, ``(16, 8, 8)``) is channels-first.

    MinAtar's torso reads values unscaled: small grids such as MiniGrid's hold object, colour
    and state codes, not pixels, and rlherd reads MinAtar's the same way. The Atari torso scales
    uint8 pixels by 1/255."""

    def __init__(self, key: str, leaf: Leaf):
        super().__init__()
        shape = (1, *leaf.shape) if len(leaf.shape) == 2 else leaf.shape
        self.plane = len(leaf.shape) == 2
        self.channels_last = channels_last(shape)
        c, h, w = (shape[2], *shape[:2]) if self.channels_last else shape
        if min(h, w) < 3:
            raise ConfigError(
                f"encoder 'cnn' needs images of at least 3x3; observation key {key!r} has shape "
                f"{leaf.shape}; use 'flat'"
            )
        torso = AtariShallowTorso if min(h, w) >= ATARI_MIN_SIZE else MinAtarTorso
        self.torso = torso((c, h, w))
        self.out_dim = self.torso.out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.plane:
            return self.torso(x[:, None])
        return self.torso(x.permute(0, 3, 1, 2) if self.channels_last else x)


class _Embed(nn.Module):
    """A learnt vector per code; a 2-D grid of them then goes through a small conv stack, so a
    cell is read together with its neighbours, as NetHack's baseline reads its glyph map."""

    def __init__(self, key: str, leaf: Leaf, dim: int = EMBED_DIM):
        super().__init__()
        self.embed = nn.Embedding(leaf.categories, dim)
        self.grid = len(leaf.shape) == 2
        if self.grid:
            self.convs = _conv_stack(dim, layers=2)
            self.out_dim = GRID_OUT * math.prod(leaf.shape)
        else:
            self.convs = nn.Flatten()
            self.out_dim = dim * math.prod(leaf.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        vectors = self.embed(x.long())  # [N, *shape, dim]
        return self.convs(vectors.permute(0, 3, 1, 2) if self.grid else vectors)


class _OneHot(nn.Module):
    def __init__(self, key: str, leaf: Leaf):
        super().__init__()
        self.categories = leaf.categories
        self.out_dim = leaf.categories * math.prod(leaf.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.one_hot(x.long(), self.categories).reshape(x.shape[0], -1).float()


class _Flat(nn.Module):
    def __init__(self, key: str, leaf: Leaf):
        super().__init__()
        self.out_dim = math.prod(leaf.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1).float()  # not flatten(1): scalars arrive as [N]


PARTS = {"cnn": _Image, "embed": _Embed, "onehot": _OneHot, "flat": _Flat}


class MultiInputTorso(nn.Module):
    """Reads a dict observation: one part per array, their outputs concatenated in sorted-key
    order (fixed whatever order the environment lists them in), then an MLP.

    ``keys``, when given, selects the arrays to read; the others are skipped (and need not be
    passed to :meth:`forward`). ``encoders`` replaces the automatic choice
    (:func:`auto_encoder`) for the keys it names.
    """

    def __init__(
        self,
        obs: dict[str, Leaf],
        hidden: tuple[int, ...] = (64, 64),
        encoders: dict[str, str] | None = None,
        keys: tuple[str, ...] = (),
        activation: str = "relu",
    ):
        super().__init__()
        encoders = dict(encoders or {})
        for key in (*keys, *encoders):
            if key not in obs:
                raise ConfigError(
                    f"observation key {key!r} is not in this observation; its keys are "
                    f"{', '.join(obs)}"
                )
        for key in encoders:
            if keys and key not in keys and encoders[key] != "skip":
                raise ConfigError(
                    f"an encoder is given for observation key {key!r}, which the selected keys "
                    f"({', '.join(keys)}) leave out"
                )
        self.choices: dict[str, str] = {}
        for key in sorted(obs):
            if keys and key not in keys:
                self.choices[key] = "skip"
            else:
                self.choices[key] = encoders.get(key) or auto_encoder(key, obs[key])
            _check(key, obs[key], self.choices[key])
        self.obs = obs
        self.read = [key for key, encoder in self.choices.items() if encoder != "skip"]
        if not self.read:
            raise ConfigError(
                f"nothing to encode: every observation key ({', '.join(obs)}) is skipped"
            )
        # A list beside self.read, not a ModuleDict: keys of nested spaces hold ".", which
        # module names cannot.
        self.parts = nn.ModuleList(PARTS[self.choices[k]](k, obs[k]) for k in self.read)
        width = sum(part.out_dim for part in self.parts)
        self.mlp = MLPTorso((width,), hidden, activation)
        self.out_dim = self.mlp.out_dim

    def describe(self) -> list[tuple[str, Leaf, str]]:
        """How each array is read: ``(key, leaf, encoder)`` in sorted-key order, skipped ones
        included."""
        return [(key, self.obs[key], encoder) for key, encoder in self.choices.items()]

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        features = [part(obs[key]) for key, part in zip(self.read, self.parts, strict=True)]
        return self.mlp(torch.cat(features, dim=1))


def egocentric_crop(
    grid: torch.Tensor, x: torch.Tensor, y: torch.Tensor, size: int, fill: int
) -> torch.Tensor:
    """The ``size x size`` window of ``grid [N, H, W]`` centred on column ``x[n]``, row
    ``y[n]`` of each map (at index ``size // 2`` on both sides); cells beyond the map's edge
    read ``fill``.

    One gather for the whole batch: the map is padded by ``size // 2`` on every side, so the
    window of map rows ``y - size // 2 ...`` starts at padded row ``y``. (NLE's baseline samples
    the crop with ``grid_sample`` instead, which reads 0, a real glyph, beyond the edge.)
    """
    half = size // 2
    padded = F.pad(grid, (half, half, half, half), value=fill)
    offsets = torch.arange(size, device=grid.device)
    rows = (y.long()[:, None] + offsets)[:, :, None]  # [N, size, 1]
    cols = (x.long()[:, None] + offsets)[:, None, :]  # [N, 1, size]
    batch = torch.arange(grid.shape[0], device=grid.device)[:, None, None]
    return padded[batch, rows, cols]


class NetHackTorso(nn.Module):
    """The NetHack Learning Environment's baseline network (Küttler et al. 2020, "The NetHack
    Learning Environment", NeurIPS; TorchBeast agent ``NetHackNet`` in facebookresearch/nle,
    ``nle/agent/agent.py``), without its LSTM and heads, which rlherd's agents add.

    Reads ``glyphs`` ([N, 21, 79] codes) and ``blstats`` ([N, 27] bottom-line statistics; its
    entries 0 and 1 are the hero's column and row on the glyph map: NLE stores ``u.ux - 1``,
    ``u.uy``, win/rl/winrl.cc); other keys are ignored. Three streams, concatenated in the
    baseline's order and passed through two fully connected layers:

    - ``blstats`` as floats, unnormalised as in the baseline, through an MLP of two ReLU layers
      as wide as the embedding (``k_dim``);
    - a ``crop x crop`` window of glyphs around the hero, embedded and read by ``layers`` 3x3
      convolutions (16 filters, the last 8; ELU; size kept by padding), flattened;
    - the whole glyph map, embedded with the same table and read by a second stack of the same
      shape, flattened.

    Defaults are the baseline's: ``embed_dim=32``, ``crop=9``, ``layers=5``, ``hidden=512``
    (``h_dim``) (agent.py, ``NetHackNet.__init__``; the NeurIPS 2020 release's config.yaml
    calls 64 and 256 "stronger", at about twice the convolutions' cost).

    Where this differs from agent.py, and why: the crop is an exact gather centred on the hero
    (agent.py's ``grid_sample`` grid runs from -5 to +3 cells, one off centre, which the NeurIPS
    release fixed), and cells beyond the map read an extra embedding row (index ``categories``,
    never a glyph) rather than glyph 0; the convolutions see ``[N, K, H, W]`` where agent.py
    transposes to ``[N, K, W, H]``, the same network up to transposed kernels.

    Cost: the embedded map reaches the convolutions as a channels-last view, the layout oneDNN's
    CPU convolutions compute in, with no copy. On one core of a 2-core AMD EPYC (torch 2.13),
    forward and backward over 640 frames (8 x 80) take about 1.5 s, against 2.7 s with the
    maps made contiguous; acting (no gradients) about 0.8 ms a frame in batches of 8, against 0.9.
    """

    def __init__(
        self,
        obs: dict[str, Leaf],
        embed_dim: int = 32,
        crop: int = 9,
        layers: int = 5,
        hidden: int = 512,
    ):
        super().__init__()
        glyphs, blstats = obs.get("glyphs"), obs.get("blstats")
        if glyphs is None or blstats is None or len(glyphs.shape) != 2 or not glyphs.categories:
            raise ConfigError(
                "torso 'nethack' reads NetHack's 'glyphs' (a 2-D grid of codes) and 'blstats'; "
                f"this observation has {', '.join(f'{k} {v.shape}' for k, v in obs.items())}"
            )
        self.height, self.width = glyphs.shape
        self.crop = crop
        self.off_map = glyphs.categories  # the extra embedding row
        self.embed = nn.Embedding(glyphs.categories + 1, embed_dim)
        self.blstats_mlp = nn.Sequential(
            nn.Linear(blstats.shape[0], embed_dim), nn.ReLU(),
            nn.Linear(embed_dim, embed_dim), nn.ReLU(),
        )  # fmt: skip
        self.crop_convs = _conv_stack(embed_dim, layers)
        self.map_convs = _conv_stack(embed_dim, layers)
        width = embed_dim + GRID_OUT * (crop * crop + self.height * self.width)
        self.fc = nn.Sequential(
            nn.Linear(width, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
        )  # fmt: skip
        self.out_dim = hidden

    def _embedded(self, grid: torch.Tensor) -> torch.Tensor:
        """``[N, H, W]`` codes as ``[N, K, H, W]`` vectors (a channels-last view)."""
        return self.embed(grid).permute(0, 3, 1, 2)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        glyphs, blstats = obs["glyphs"].long(), obs["blstats"]
        # Clamped so that any blstats (a zero-filled buffer, a corrupted frame) gives a crop.
        x = blstats[:, 0].long().clamp(0, self.width - 1)
        y = blstats[:, 1].long().clamp(0, self.height - 1)
        window = egocentric_crop(glyphs, x, y, self.crop, self.off_map)
        stats = self.blstats_mlp(blstats.float())
        around = self.crop_convs(self._embedded(window))
        whole = self.map_convs(self._embedded(glyphs))
        return self.fc(torch.cat([stats, around, whole], dim=1))
