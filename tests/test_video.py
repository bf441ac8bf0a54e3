"""``rlherd eval --video`` writes a watchable GIF or MP4 for every environment family: frames of
any dtype, channel count and size become uint8 RGB, enlarged to a short side of at least 256
pixels (MP4: padded to sides that are multiples of 16), and neither format warns."""

from __future__ import annotations

import logging
import os
import subprocess
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlherd.errors import ConfigError
from rlherd.run.video import MACRO_BLOCK, MIN_SIDE, as_video, write_video

iio = pytest.importorskip("imageio.v3")


# ------------------------------------------------------------------------- frame conversion
def _block(expected: np.ndarray, factor: int) -> np.ndarray:
    """The hand-built frame ``expected`` [H, W, 3] with each pixel a ``factor`` square."""
    return expected.repeat(factor, axis=0).repeat(factor, axis=1)


RGB = np.array([[[0, 0, 0], [255, 128, 0]], [[0, 255, 255], [255, 255, 255]]], np.uint8)
GREY = np.array([[[0] * 3, [255] * 3], [[51] * 3, [255] * 3]], np.uint8)


@pytest.mark.parametrize(
    "frame, expected",
    [
        (RGB, RGB),  # uint8 RGB
        (RGB / 255.0, RGB),  # float in [0, 1] (MinAtar)
        (RGB.astype(np.float32), RGB),  # float in [0, 255]
        (RGB.astype(np.int64), RGB),  # int
        (np.array([[0, 1000], [51, 255]]), GREY),  # int grey, clipped to 255
        (np.array([[False, True], [False, True]]), np.where(GREY == 51, 0, GREY)),  # bool
        (np.array([[0.0, 1.0], [0.2, 1.0]]), GREY),  # H x W float in [0, 1]
        (np.array([[0, 255], [51, 255]], np.uint8)[..., None], GREY),  # H x W x 1
        (np.concatenate([RGB, np.full((2, 2, 1), 7, np.uint8)], axis=-1), RGB),  # RGBA
    ],
    ids=["uint8", "float01", "float255", "int", "int-grey", "bool", "grey-2d", "grey-1ch", "rgba"],
)
def test_frames_of_any_dtype_and_channels_become_enlarged_uint8_rgb(frame, expected):
    video = as_video([frame, frame])
    assert video.dtype == np.uint8 and video.shape == (2, 256, 256, 3)  # 2 x 128
    np.testing.assert_array_equal(video[1], _block(expected, 128))


def test_a_float_video_is_read_on_one_scale_for_all_its_frames():
    """A dark frame of a [0, 255] float video (every value <= 1) stays dark."""
    bright, dark = np.full((16, 16, 3), 200.0), np.full((16, 16, 3), 1.0)
    video = as_video([bright, dark])
    assert video[0].max() == 200 and video[1].max() == 1


@pytest.mark.parametrize(
    "shape, gif, mp4",
    [
        ((10, 10, 3), (260, 260), (272, 272)),  # MinAtar: 26x
        ((210, 160, 3), (420, 320), (432, 320)),  # Atari: 2x
        ((480, 480, 3), (480, 480), (480, 480)),  # dm_control through Shimmy: as it is
        ((400, 600, 3), (400, 600), (400, 608)),  # CartPole
        ((5, 7), (260, 364), (272, 368)),  # a small grey grid
    ],
    ids=["minatar", "atari", "dm_control", "cartpole", "grey-grid"],
)
def test_sizes_reach_the_minimum_side_and_mp4_sides_are_macro_block_multiples(shape, gif, mp4):
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, shape, dtype=np.uint8)
    assert as_video([frame]).shape[1:3] == gif
    padded = as_video([frame], multiple=MACRO_BLOCK)
    assert padded.shape[1:3] == mp4 and min(mp4) >= MIN_SIDE
    # The enlarged frame sits in the middle of the black padding.
    top, left = (mp4[0] - gif[0]) // 2, (mp4[1] - gif[1]) // 2
    np.testing.assert_array_equal(padded[0, top : top + gif[0], left : left + gif[1]],
                                  as_video([frame])[0])  # fmt: skip
    assert padded.sum() == as_video([frame]).sum()  # the padding is black


def test_frames_of_other_shapes_are_refused_clearly():
    with pytest.raises(ValueError, match="H x W x 1, 3 or 4"):
        as_video([np.zeros((4, 4, 2))])
    with pytest.raises(ValueError, match="frame 1"):
        as_video([np.zeros((4, 4, 3)), np.zeros((5, 4, 3))])


# ----------------------------------------------------------------------------- written files
def _write_quietly(write, caplog) -> Any:
    """``write()``'s result; fails on any Python warning or logged warning (imageio-ffmpeg logs
    its resizing of frames whose sides are not multiples of 16)."""
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        result = write()
    assert [str(w.message) for w in caught] == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    return result


@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
@pytest.mark.parametrize("family", ["minatar", "atari"])
def test_written_videos_read_back_enlarged_without_warnings(tmp_path, caplog, suffix, family):
    """MinAtar renders 10x10 float RGB in [0, 1], Atari 210x160 uint8 RGB."""
    if suffix == ".mp4":
        pytest.importorskip("imageio_ffmpeg")
    rng = np.random.default_rng(0)
    if family == "minatar":
        frames = [rng.random((10, 10, 3)) for _ in range(4)]
    else:
        frames = [rng.integers(0, 256, (210, 160, 3), dtype=np.uint8) for _ in range(4)]
    path = tmp_path / f"v{suffix}"
    _write_quietly(lambda: write_video(path, frames), caplog)
    back = iio.imread(path)
    expected = as_video(frames, multiple=1 if suffix == ".gif" else MACRO_BLOCK)
    assert back.dtype == np.uint8 and back.shape == expected.shape
    if suffix == ".gif":  # lossless but for the palette of 256 colours
        assert np.abs(back.astype(int) - expected).mean() < 16


def test_a_video_name_of_another_format_is_refused_before_any_episode(tmp_path, monkeypatch):
    from rlherd.commands import evaluate

    monkeypatch.setattr(evaluate, "load_run", lambda run_dir: pytest.fail("episodes were played"))
    with pytest.raises(ConfigError, match=r"--video writes a \.gif or an \.mp4; got .*v\.avi"):
        evaluate.evaluate(tmp_path, video=tmp_path / "v.avi")


def test_a_video_of_a_game_that_draws_no_frames_says_to_drop_it(tmp_path):
    """OpenSpiel's games render as text: the refusal named the render mode alone, not the
    flag that asked for it."""
    pytest.importorskip("pyspiel")
    import rlherd
    from rlherd.commands.evaluate import evaluate

    run = rlherd.train("mcts", "open_spiel/tic_tac_toe", total_steps=50, progress=False,
                       run_dir=tmp_path / "run", num_simulations=4).path  # fmt: skip
    with pytest.raises(ConfigError, match="it draws no frames to record: drop --video"):
        evaluate(run, episodes=1, opponent="random", video=tmp_path / "game.gif")


class Blank(gym.Env):
    """An environment of one's own that draws nothing: Gymnasium's ``render()``, returning None."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, True, False, {}

    def render(self):
        return None


class Idle:
    """An actor that always plays action 0."""

    def observe_first(self, obs, envs):
        pass

    def select_action(self, obs):
        return np.zeros(1, np.int64)


@pytest.mark.parametrize(("render", "says"), [
    (Blank.render, r"Blank's render\(\) returned None in render_mode 'rgb_array', not an image"),
    (gym.Env.render, r"Blank has no render\(\)"),
])  # fmt: skip
def test_a_video_of_an_environment_that_draws_nothing_says_to_drop_it(render, says, monkeypatch):
    """Its first frame, None, reached the video writer only after every episode was played,
    as a ValueError about a frame of shape (); Gymnasium's own render() raised
    NotImplementedError from inside the episode."""
    from rlherd import envs as rl_envs
    from rlherd.run.evaluation import run_episodes

    monkeypatch.setattr(Blank, "render", render)
    env = rl_envs.make(f"{__name__}:Blank", render_mode="rgb_array")
    with pytest.raises(ConfigError, match=rf"{says}.*it draws no frames to record: drop --video"):
        run_episodes(env, Idle(), episodes=1, seed=0, record=True)


def test_minatar_eval_writes_an_enlarged_gif_and_mp4(tmp_path, caplog):
    """A MinAtar run (float 10x10x3 frames from render) evaluates to a GIF and an MP4 of
    260x260 (MP4: 272x272) uint8 frames, without a warning."""
    pytest.importorskip("minatar")
    from rlherd.cli import main

    run = tmp_path / "run"
    assert main(["train", "dqn", "--env", "MinAtar/Breakout-v1", "--total-steps", "300",
                 "--run-dir", str(run), "--no-progress"]) == 0  # fmt: skip
    sizes = {".gif": (260, 260, 3)}
    try:
        import imageio_ffmpeg  # noqa: F401

        sizes[".mp4"] = (272, 272, 3)
    except ImportError:
        pass
    for suffix, size in sizes.items():
        video = tmp_path / f"episode{suffix}"
        args = ["eval", str(run), "--episodes", "1", "--video", str(video)]
        assert _write_quietly(lambda args=args: main(args), caplog) == 0
        frames = iio.imread(video)
        assert frames.dtype == np.uint8 and frames.shape[1:] == size and len(frames) > 1
        assert frames.max() > 0  # not a black video


def test_ffmpeg_is_spawned_without_a_preexec_fn(tmp_path, monkeypatch):
    """A ``preexec_fn`` makes Python fork() where it would vfork(), and the fork runs gRPC's fork
    handlers in ffmpeg's child when gRPC is loaded (a poly run in the same process): seen to
    break ffmpeg's pipe about once in 80 videos."""
    pytest.importorskip("imageio_ffmpeg")
    monkeypatch.delenv("IMAGEIO_FFMPEG_NO_PREVENT_SIGINT", raising=False)  # conftest sets it
    popen, seen = subprocess.Popen, []

    def recording(*args, **kwargs):
        seen.append(kwargs.get("preexec_fn"))
        return popen(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording)
    write_video(tmp_path / "v.mp4", [np.zeros((16, 16, 3), np.uint8)] * 2)
    assert seen and all(fn is None for fn in seen)
    assert "IMAGEIO_FFMPEG_NO_PREVENT_SIGINT" not in os.environ  # restored


def test_a_run_trained_with_a_render_mode_of_its_own_records_its_video(tmp_path):
    """Its options already name a render mode: --video's rgb_array takes its place (both were
    passed, and make_one got render_mode twice)."""
    import rlherd
    from rlherd.commands.evaluate import evaluate

    rlherd.train("dqn", "CartPole-v1", total_steps=50, run_dir=tmp_path / "run", progress=False,
                 env_kwargs=dict(render_mode="rgb_array"))  # fmt: skip
    evaluate(tmp_path / "run", episodes=1, video=tmp_path / "episode.gif")
    assert iio.imread(tmp_path / "episode.gif").shape[1:] == (400, 600, 3)
