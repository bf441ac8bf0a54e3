import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rlherd.core import EnvSpec, Leaf
from rlherd.errors import ConfigError
from rlherd.networks import AtariShallowTorso, MinAtarTorso, MLPTorso, make_torso
from rlherd.networks.encoders import (
    ENCODERS,
    MultiInputTorso,
    NetHackTorso,
    auto_encoder,
    egocentric_crop,
)

U8, I8, I16, I64, F32, BOOL = (np.dtype(t) for t in ("uint8", "int8", "int16", "int64",
                                                      "float32", "bool"))  # fmt: skip

MINIGRID = {"image": Leaf((7, 7, 3), U8, "box", 256), "direction": Leaf((), I64, "discrete", 4)}
NETHACK = {"glyphs": Leaf((21, 79), I16, "box", 5977), "blstats": Leaf((27,), I64, "box", 0)}
BLACKJACK = {str(i): Leaf((), I64, "discrete", n) for i, n in enumerate((32, 11, 2))}


def nethack_batch(n: int, x=None, y=None) -> dict[str, torch.Tensor]:
    blstats = torch.randint(0, 30, (n, 27))
    blstats[:, 0] = torch.randint(0, 79, (n,)) if x is None else torch.as_tensor(x)
    blstats[:, 1] = torch.randint(0, 21, (n,)) if y is None else torch.as_tensor(y)
    return {"glyphs": torch.randint(0, 5977, (n, 21, 79), dtype=torch.int16), "blstats": blstats}


def features(obs: dict[str, Leaf], **kwargs) -> MultiInputTorso:
    """A torso without an MLP on top: its output is the parts' concatenation."""
    return MultiInputTorso(obs, hidden=(), **kwargs)


# ------------------------------------------------------------------------- automatic choices


@pytest.mark.parametrize(
    "obs,expected",
    [
        (MINIGRID, {"image": "cnn", "direction": "onehot"}),
        (NETHACK, {"glyphs": "embed", "blstats": "flat"}),
        (BLACKJACK, {"0": "onehot", "1": "onehot", "2": "onehot"}),
        ({"action_mask": Leaf((5,), I8, "binary", 2), "pos": Leaf((2,), F32)},
         {"action_mask": "skip", "pos": "flat"}),
        ({"cells": Leaf((40,), I64, "discrete", 30),  # 1200 one-hot inputs: too many
          "bits": Leaf((6,), BOOL, "binary", 2),
          "counts": Leaf((4, 4), I64, "box", 0)},  # integers without categories
         {"cells": "embed", "bits": "flat", "counts": "flat"}),
    ],
)  # fmt: skip
def test_automatic_choices(obs, expected):
    assert {key: auto_encoder(key, leaf) for key, leaf in obs.items()} == expected
    described = MultiInputTorso(obs).describe()
    assert described == [(key, obs[key], expected[key]) for key in sorted(obs)]


def test_onehot_limit_is_entries_times_categories():
    assert auto_encoder("a", Leaf((32,), I64, "discrete", 32)) == "onehot"  # 1024
    assert auto_encoder("a", Leaf((33,), I64, "discrete", 32)) == "embed"  # 1056


# ------------------------------------------------------------------ parts against references


def test_onehot_part_is_a_one_hot_of_every_entry():
    obs = {"cells": Leaf((3,), I64, "discrete", 5)}
    x = torch.tensor([[0, 4, 2], [1, 1, 3]])
    expected = torch.zeros(2, 3, 5)
    for n in range(2):
        for i in range(3):
            expected[n, i, x[n, i]] = 1.0
    torch.testing.assert_close(features(obs)({"cells": x}), expected.reshape(2, 15))


def test_onehot_of_a_scalar_discrete():
    x = torch.tensor([3, 0, 1])
    out = features({"d": Leaf((), I64, "discrete", 4)})({"d": x})
    torch.testing.assert_close(out, torch.eye(4)[x])


def test_flat_part_is_the_float_flatten():
    obs = {"grid": Leaf((2, 3), I8, "box", 0), "bits": Leaf((4,), BOOL, "binary", 2),
           "value": Leaf((), F32)}  # fmt: skip
    x = {"grid": torch.randint(-5, 5, (3, 2, 3), dtype=torch.int8),
         "bits": torch.rand(3, 4) > 0.5, "value": torch.randn(3)}  # fmt: skip
    expected = torch.cat([x["bits"].float(), x["grid"].float().reshape(3, 6), x["value"][:, None]],
                         dim=1)  # fmt: skip
    torch.testing.assert_close(features(obs)(x), expected)


def test_embed_part_looks_up_each_code():
    obs = {"cells": Leaf((40,), I64, "discrete", 30)}
    net = features(obs)
    x = torch.randint(0, 30, (4, 40))
    weight = net.parts[0].embed.weight
    torch.testing.assert_close(net({"cells": x}), weight[x].reshape(4, -1))


def test_embed_part_reads_a_grid_with_convolutions_over_its_cells():
    net = features({"glyphs": NETHACK["glyphs"]})
    x = torch.randint(0, 5977, (2, 21, 79), dtype=torch.int16)
    part = net.parts[0]
    h = part.embed.weight[x.long()].permute(0, 3, 1, 2)  # [N, dim, H, W]
    convs = [m for m in part.convs if isinstance(m, torch.nn.Conv2d)]
    for conv in convs:
        h = F.elu(F.conv2d(h, conv.weight, conv.bias, padding=1))
    assert len(convs) == 2 and convs[-1].out_channels == 8
    torch.testing.assert_close(net({"glyphs": x}), h.reshape(2, -1))


def test_channels_last_images_are_turned_channels_first():
    net = features({"image": MINIGRID["image"]})
    torso = net.parts[0].torso
    assert isinstance(torso, MinAtarTorso)
    reference = MinAtarTorso((3, 7, 7))
    reference.load_state_dict(torso.state_dict())
    x = torch.randint(0, 11, (5, 7, 7, 3), dtype=torch.uint8)
    # MiniGrid's values are codes, read unscaled as MinAtar's are
    torch.testing.assert_close(net({"image": x}), reference(x.permute(0, 3, 1, 2).float()))


def test_channels_first_images_are_read_as_they_are():
    net = features({"image": Leaf((3, 7, 7), U8, "box", 256)})
    x = torch.randint(0, 11, (5, 3, 7, 7), dtype=torch.uint8)
    torch.testing.assert_close(net({"image": x}), net.parts[0].torso(x))
    assert net.parts[0].torso.conv[0].in_channels == 3


def test_channels_first_when_the_last_side_is_not_the_shortest():
    """(16, 8, 8): 16 channels of 8 x 8 (its last side is not shorter than its second)."""
    net = features({"planes": Leaf((16, 8, 8), np.dtype(np.float32), "box")})
    assert net.parts[0].torso.conv[0].in_channels == 16
    assert net({"planes": torch.randn(2, 16, 8, 8)}).shape == (2, 128)  # MinAtar's fc


def test_grayscale_frames_are_images_and_small_grids_are_codes():
    """A 2-D uint8 frame of Atari's size is a one-channel image; NetHack's 21 x 79 uint8
    characters are codes."""
    assert auto_encoder("screen", Leaf((84, 84), U8, "box", 256)) == "cnn"
    assert auto_encoder("chars", Leaf((21, 79), U8, "box", 256)) == "embed"
    net = features({"screen": Leaf((84, 84), U8, "box", 256)})
    torso = net.parts[0].torso
    assert isinstance(torso, AtariShallowTorso) and torso.convs[0].in_channels == 1
    x = torch.randint(0, 256, (2, 84, 84), dtype=torch.uint8)
    expected = torso.fc(torso.convs(x[:, None].float() / 255.0))
    torch.testing.assert_close(net.parts[0](x), expected)


def test_large_images_go_through_the_atari_torso_scaled():
    net = features({"frame": Leaf((84, 84, 3), U8, "box", 256)})
    torso = net.parts[0].torso
    assert isinstance(torso, AtariShallowTorso)
    x = torch.randint(0, 256, (2, 84, 84, 3), dtype=torch.uint8)
    frames = x.permute(0, 3, 1, 2).float() / 255.0
    torch.testing.assert_close(net({"frame": x}), torso.fc(torso.convs(frames)))


def test_parts_are_concatenated_in_sorted_key_order_under_the_mlp():
    obs = {"c": Leaf((2,), F32), "a": Leaf((), I64, "discrete", 3), "b": Leaf((1,), F32)}
    net = MultiInputTorso(obs, hidden=(5, 4), activation="tanh")
    x = {"c": torch.randn(6, 2), "a": torch.randint(0, 3, (6,)), "b": torch.randn(6, 1)}
    h = torch.cat([F.one_hot(x["a"], 3).float(), x["b"], x["c"]], dim=1)
    linears = [m for m in net.mlp.modules() if isinstance(m, torch.nn.Linear)]
    assert [lin.in_features for lin in linears] == [6, 5] and net.out_dim == 4
    for linear in linears:
        h = torch.tanh(linear(h))
    torch.testing.assert_close(net(x), h)


# ---------------------------------------------------------------------------- selection, errors


def test_obs_keys_selects_what_is_read():
    net = features(MINIGRID, keys=("image",))
    assert [encoder for _, _, encoder in net.describe()] == ["skip", "cnn"]  # direction, image
    x = torch.randint(0, 11, (3, 7, 7, 3), dtype=torch.uint8)
    out = net({"image": x})  # the skipped key need not be there
    torch.testing.assert_close(out, net({"image": x, "direction": torch.tensor([0, 1, 2])}))
    assert out.shape == (3, 128)


def test_encoders_override_the_automatic_choice():
    net = features(MINIGRID, encoders={"image": "flat", "direction": "embed"})
    assert [encoder for _, _, encoder in net.describe()] == ["embed", "flat"]
    assert net.out_dim == 16 + 7 * 7 * 3


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(encoders={"imag": "flat"}), "'imag' is not in this observation; its keys are image, "
                                          "direction"),
        (dict(keys=("image", "mission")), "'mission' is not in this observation; its keys are"),
        (dict(encoders={"image": "conv"}), "unknown encoder 'conv'.*cnn, embed, onehot, flat, "
                                           "skip"),
        (dict(encoders={"direction": "cnn"}), "'cnn' reads images.*'direction'"),
        (dict(encoders={"image": "skip", "direction": "skip"}), "nothing to encode"),
        (dict(keys=("image",), encoders={"direction": "flat"}), "selected keys .* leave out"),
    ],
)  # fmt: skip
def test_configuration_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        MultiInputTorso(MINIGRID, **kwargs)


@pytest.mark.parametrize("encoder", ["onehot", "embed"])
def test_codes_need_categories(encoder):
    with pytest.raises(ConfigError, match=f"{encoder!r} reads codes.*'blstats'.*use 'flat'"):
        MultiInputTorso(NETHACK, encoders={"blstats": encoder})


def test_the_action_mask_is_never_encoded():
    obs = {"action_mask": Leaf((4,), BOOL, "binary", 2)}
    with pytest.raises(ConfigError, match="nothing to encode"):
        MultiInputTorso(obs)
    with pytest.raises(ConfigError, match="legal-action mask"):
        MultiInputTorso(obs, encoders={"action_mask": "flat"})


def test_cnn_needs_a_3x3_image():
    with pytest.raises(ConfigError, match="at least 3x3.*'strip'"):
        MultiInputTorso({"strip": Leaf((1, 8, 2), F32)}, encoders={"strip": "cnn"})


# ------------------------------------------------------------------------------------- NetHack


def naive_crop(glyphs: torch.Tensor, x, y, size: int, fill: int) -> torch.Tensor:
    out = torch.full((len(glyphs), size, size), fill, dtype=glyphs.dtype)
    for n in range(len(glyphs)):
        for i in range(size):
            for j in range(size):
                row, col = int(y[n]) - size // 2 + i, int(x[n]) - size // 2 + j
                if 0 <= row < glyphs.shape[1] and 0 <= col < glyphs.shape[2]:
                    out[n, i, j] = glyphs[n, row, col]
    return out


def test_crop_matches_slicing_at_corners_edges_and_inside():
    torch.manual_seed(0)
    x = torch.tensor([0, 78, 0, 78, 40, 3, 75, 40, 12])
    y = torch.tensor([0, 0, 20, 20, 10, 2, 18, 0, 20])
    glyphs = torch.randint(0, 5976, (len(x), 21, 79)).long()
    for size in (9, 4):
        crop = egocentric_crop(glyphs, x, y, size, fill=5977)
        torch.testing.assert_close(crop, naive_crop(glyphs, x, y, size, fill=5977))
    crop = egocentric_crop(glyphs, x, y, 9, fill=5977)
    torch.testing.assert_close(crop[:, 4, 4], glyphs[torch.arange(len(x)), y, x])  # centred
    assert (crop[0, :4, :] == 5977).all() and (crop[0, 4:, 4:] != 5977).all()


def test_nethack_torso_has_the_baselines_shape():
    net = NetHackTorso(NETHACK)
    assert net.embed.embedding_dim == 32 and net.out_dim == 512
    for stack in (net.crop_convs, net.map_convs):
        convs = [m for m in stack if isinstance(m, torch.nn.Conv2d)]
        assert [c.out_channels for c in convs] == [16, 16, 16, 16, 8]
        assert all(c.kernel_size == (3, 3) and c.padding == (1, 1) for c in convs)
    assert net.fc[0].in_features == 32 + 8 * 9 * 9 + 8 * 21 * 79


def test_nethack_torso_reads_blstats_the_crop_and_the_map():
    torch.manual_seed(0)
    net = NetHackTorso(NETHACK)
    obs = nethack_batch(4, x=[0, 78, 30, 5], y=[0, 20, 10, 19])
    glyphs, blstats = obs["glyphs"].long(), obs["blstats"]
    crop = naive_crop(glyphs, blstats[:, 0], blstats[:, 1], 9, fill=5977)

    def convs(stack, codes):
        h = net.embed.weight[codes].permute(0, 3, 1, 2)
        for conv in (m for m in stack if isinstance(m, torch.nn.Conv2d)):
            h = F.elu(F.conv2d(h, conv.weight, conv.bias, padding=1))
        return h.reshape(len(h), -1)

    reps = [net.blstats_mlp(blstats.float()), convs(net.crop_convs, crop),
            convs(net.map_convs, glyphs)]  # fmt: skip
    torch.testing.assert_close(net(obs), net.fc(torch.cat(reps, dim=1)))


def test_nethack_torso_needs_glyphs_and_blstats():
    with pytest.raises(ConfigError, match="'glyphs'.*'blstats'.*image"):
        NetHackTorso(MINIGRID)


# --------------------------------------------------------------------- gradients, input dtypes

MIXED = {
    "image": Leaf((7, 7, 3), U8, "box", 256),  # cnn
    "glyphs": Leaf((5, 6), I16, "box", 50),  # embed, grid
    "cells": Leaf((40,), I64, "discrete", 30),  # embed, flattened
    "direction": Leaf((), I64, "discrete", 4),  # onehot
    "bits": Leaf((3,), BOOL, "binary", 2),  # flat
    "pos": Leaf((2,), F32),  # flat
    "action_mask": Leaf((4,), I8, "binary", 2),  # skip
}


def mixed_batch(n: int) -> dict[str, torch.Tensor]:
    return {
        "image": torch.randint(0, 11, (n, 7, 7, 3), dtype=torch.uint8),
        "glyphs": torch.randint(0, 50, (n, 5, 6), dtype=torch.int16),
        "cells": torch.randint(0, 30, (n, 40)),
        "direction": torch.randint(0, 4, (n,)),
        "bits": torch.rand(n, 3) > 0.5,
        "pos": torch.randn(n, 2),
        "action_mask": torch.ones(n, 4, dtype=torch.int8),
    }


def test_mixed_input_dtypes_are_accepted():
    net = MultiInputTorso(MIXED)
    assert {e for _, _, e in net.describe()} == set(ENCODERS)
    out = net(mixed_batch(3))
    assert out.shape == (3, 64) and out.dtype == torch.float32 and torch.isfinite(out).all()


def assert_every_parameter_has_a_gradient(net: torch.nn.Module, obs) -> None:
    net(obs).square().sum().backward()
    for name, p in net.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_gradients_reach_every_parameter():
    torch.manual_seed(0)
    assert_every_parameter_has_a_gradient(MultiInputTorso(MIXED), mixed_batch(8))
    net = NetHackTorso(NETHACK)
    assert_every_parameter_has_a_gradient(net, nethack_batch(3, x=[0, 78, 30], y=[0, 20, 10]))
    assert net.embed.weight.grad[5977].abs().sum() > 0  # the off-map row: these crops run off


# ------------------------------------------------------------------------------------ make_torso


def dict_spec(obs: dict[str, Leaf]) -> EnvSpec:
    return EnvSpec("dict-env", obs, "discrete", num_actions=4)


def test_make_torso_for_dict_observations():
    net = make_torso(dict_spec(MINIGRID), hidden=(32,), obs_keys=("image", "direction"),
                     obs_encoders={"direction": "embed"})  # fmt: skip
    assert isinstance(net, MultiInputTorso) and net.out_dim == 32
    assert [e for _, _, e in net.describe()] == ["embed", "cnn"]
    assert isinstance(make_torso(dict_spec(MINIGRID), "mlp"), MultiInputTorso)
    assert isinstance(make_torso(dict_spec(NETHACK), "nethack"), NetHackTorso)
    with pytest.raises(ConfigError, match="torso 'shallow' reads one array.*auto, mlp or nethack"):
        make_torso(dict_spec(MINIGRID), "shallow")
    with pytest.raises(ConfigError, match="obs_keys and obs_encoders apply to torso auto or mlp"):
        make_torso(dict_spec(NETHACK), "nethack", obs_keys=("glyphs",))


def test_make_torso_for_one_array_is_unchanged_and_refuses_dict_options():
    spec = EnvSpec("vec", Leaf((4,), F32), "discrete", num_actions=2)
    net = make_torso(spec, hidden=(8,))
    assert type(net) is MLPTorso and net.out_dim == 8
    with pytest.raises(ConfigError, match="observes one array"):
        make_torso(spec, obs_keys=("x",))
    with pytest.raises(ConfigError, match="observes one array"):
        make_torso(spec, obs_encoders={"x": "flat"})
    with pytest.raises(ConfigError, match="'nethack' reads NetHack's dict"):
        make_torso(spec, "nethack")
