import numpy as np
import pytest
import torch

from rlherd.agents.impala import ImpalaConfig
from rlherd.agents.impala.networks import ImpalaNet
from rlherd.core import EnvSpec, Leaf
from rlherd.networks import (
    AtariShallowTorso,
    ImpalaResNetTorso,
    LSTMCore,
    MinAtarTorso,
    MLPTorso,
    make_torso,
)


def image_spec(shape):
    return EnvSpec("img", Leaf(shape, np.dtype(np.uint8)), "discrete", num_actions=4)


@pytest.mark.parametrize(
    "torso,shape,out",
    [
        (AtariShallowTorso, (4, 84, 84), 512),
        (ImpalaResNetTorso, (4, 84, 84), 256),
        (MinAtarTorso, (4, 10, 10), 128),
    ],
)
def test_image_torsos(torso, shape, out):
    net = torso(shape)
    x = torch.randint(0, 255, (3, *shape), dtype=torch.uint8)
    assert net(x).shape == (3, out) and net.out_dim == out


@pytest.mark.parametrize("torso", [AtariShallowTorso, ImpalaResNetTorso])
def test_atari_torsos_compute_what_their_layers_do_on_scaled_frames(torso):
    """The torsos scale uint8 frames to [0, 1] and, in passes with gradients, lay them out
    channels-last for oneDNN; features and gradients are those of the layers applied to
    ``frames / 255`` as they come, with and without gradients."""
    torch.manual_seed(0)
    net = torso((4, 84, 84))
    x = torch.randint(0, 256, (6, 4, 84, 84), dtype=torch.uint8)
    params = list(net.parameters())
    features = net(x)
    grads = torch.autograd.grad(features.square().sum(), params)
    reference = net.fc(net.convs(x.float() / 255.0))
    reference_grads = torch.autograd.grad(reference.square().sum(), params)
    torch.testing.assert_close(features, reference)
    torch.testing.assert_close(grads, reference_grads)
    with torch.no_grad():
        torch.testing.assert_close(net(x), reference)
    floats = torch.rand(6, 4, 84, 84)  # float frames pass unscaled
    torch.testing.assert_close(net(floats), net.fc(net.convs(floats)))


def test_resnet_has_three_sections_of_two_residual_blocks():
    net = ImpalaResNetTorso((4, 84, 84))
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [16] * 5 + [32] * 5 + [32] * 5


def test_make_torso_auto():
    assert isinstance(make_torso(image_spec((4, 84, 84))), AtariShallowTorso)
    assert isinstance(make_torso(image_spec((4, 10, 10))), MinAtarTorso)
    vec = EnvSpec("v", Leaf((4,), np.dtype(np.float32)), "discrete", num_actions=2)
    assert isinstance(make_torso(vec), MLPTorso)
    with pytest.raises(ValueError, match="image observations"):
        make_torso(vec, "deep")
    with pytest.raises(ValueError, match="unknown torso"):
        make_torso(vec, "huge")


@pytest.mark.parametrize(("kind", "shape"), [("auto", (64, 64, 3)), ("deep", (84, 84, 4)),
                                             ("auto", (7, 7, 3))])  # fmt: skip
def test_a_channels_last_image_is_read_as_its_channels_first_transpose(kind, shape):
    """A (64, 64, 3) render, the usual layout of one's own image environment, went to a
    convolution made for channels-first frames: "Kernel size can't be greater than actual
    input size", from inside torch."""
    torch.manual_seed(0)
    net = make_torso(image_spec(shape), kind)
    h, w, c = shape
    torch.manual_seed(0)
    reference = make_torso(image_spec((c, h, w)), kind)
    x = torch.randint(0, 256, (2, *shape), dtype=torch.uint8)
    torch.testing.assert_close(net(x), reference(x.permute(0, 3, 1, 2)))


def test_lstm_resets_at_episode_starts():
    torch.manual_seed(0)
    core = LSTMCore(3, 5)
    x = torch.randn(6, 2, 3)
    first = torch.zeros(6, 2, dtype=torch.bool)
    first[3, 0] = True
    state = tuple(torch.randn_like(s) for s in core.initial_state(2))
    out, _ = core(x, first, state)
    fresh, _ = core(x[3:, :1], torch.zeros(3, 1, dtype=torch.bool), core.initial_state(1))
    torch.testing.assert_close(out[3:, :1], fresh)
    carried, _ = core(x[3:, 1:], torch.zeros(3, 1, dtype=torch.bool), core.initial_state(1))
    assert not torch.allclose(out[3:, 1:], carried)  # env 1 kept its state


def test_impala_net_outputs_and_rejects_continuous():
    spec = EnvSpec("v", Leaf((4,), np.dtype(np.float32)), "discrete", num_actions=3)
    net = ImpalaNet(spec, ImpalaConfig(use_lstm=True, lstm_size=8))
    out, state = net(
        torch.randn(5, 2, 4), torch.zeros(5, 2, dtype=torch.bool), net.initial_state(2)
    )
    assert out["policy_logits"].shape == (5, 2, 3) and out["baseline"].shape == (5, 2)
    assert state[0].shape == (1, 2, 8)
    box = EnvSpec("p", Leaf((3,), np.dtype(np.float32)), "continuous", action_shape=(1,))
    with pytest.raises(ValueError, match="Discrete"):
        ImpalaNet(box, ImpalaConfig())
