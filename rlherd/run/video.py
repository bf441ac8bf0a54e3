"""Writing frames to a GIF or MP4 (``rlherd eval --video``).

Environments render very different frames: Atari 210x160 uint8 RGB, MinAtar 10x10 float RGB in
[0, 1], MiniGrid 160x160, a grid world perhaps a 2-D array of booleans or cell codes. They are all
turned into uint8 RGB frames, enlarged by a whole factor (each pixel a square block, so cells stay
sharp) until the short side reaches :data:`MIN_SIDE`, and, for an MP4, padded with black to
sides that are multiples of :data:`MACRO_BLOCK`, which is what H.264 encodes (given other sizes,
imageio-ffmpeg rescales the frames and logs a warning for each video).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from rlherd.errors import ConfigError, MissingExtra
from rlherd.run.rundir import check_folder, make_folder

MIN_SIDE = 256  # pixels on a video's short side, at least: MinAtar's 10x10 frames become 260x260
MACRO_BLOCK = 16  # an MP4's sides are multiples of this


def check_writable(path: Path) -> None:
    """Raise :class:`ConfigError` if ``path`` is not a .gif or .mp4, :class:`MissingExtra` if its
    format cannot be written here: called before an evaluation plays its episodes, so a wrong
    name or a missing extra never costs them."""
    if path.suffix.lower() not in (".gif", ".mp4"):
        raise ConfigError(f"--video writes a .gif or an .mp4; got {path} (name it e.g. run.gif)")
    check_folder(path.parent, "--video")  # a file in the way of its folder
    try:
        import imageio.v3  # noqa: F401
    except ImportError as e:
        raise MissingExtra("videos need imageio: pip install 'rlherd[video]'") from e
    if path.suffix.lower() == ".mp4":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError as e:
            raise MissingExtra(
                f"{path} needs imageio-ffmpeg (pip install 'rlherd[video]'); a .gif works "
                "with the base install"
            ) from e


def write_video(path: Path, frames: Sequence[np.ndarray], fps: int = 30) -> None:
    """Write ``frames`` (any dtype, size and channel count :func:`as_video` reads) to ``path``,
    a .gif or an .mp4."""
    check_writable(path)
    make_folder(path.parent, "--video")
    import imageio.v3 as iio

    gif = path.suffix.lower() == ".gif"
    video = as_video(frames, multiple=1 if gif else MACRO_BLOCK)
    if gif:
        iio.imwrite(path, video, duration=1000 / fps, loop=0)
        return
    try:
        with _spawned_without_fork_handlers():
            iio.imwrite(path, video, fps=fps)
    except (ImportError, OSError, ValueError) as e:
        raise MissingExtra(
            f"could not write {path}: {e}. MP4 needs imageio-ffmpeg (pip install "
            "'rlherd[video]'); a .gif works with the base install"
        ) from e


@contextlib.contextmanager
def _spawned_without_fork_handlers() -> Iterator[None]:
    """imageio-ffmpeg starts ffmpeg with ``preexec_fn=os.setpgrp`` (to keep Ctrl-C from it), and
    a ``preexec_fn`` makes Python fork() where it would vfork(): the child then runs the fork
    handlers of every library loaded, and gRPC's (a ``poly`` run, or an environment server, in
    the same process) broke ffmpeg's pipe or its first output. imageio-ffmpeg's own switch,
    ``IMAGEIO_FFMPEG_NO_PREVENT_SIGINT``, drops the ``preexec_fn`` while the video is written."""
    key = "IMAGEIO_FFMPEG_NO_PREVENT_SIGINT"
    before = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def as_video(frames: Sequence[np.ndarray], multiple: int = 1) -> np.ndarray:
    """``frames`` as one ``[N, H, W, 3]`` uint8 array, enlarged by the smallest whole factor that
    makes the short side at least :data:`MIN_SIDE`, then padded (black, evenly on both sides)
    to sides that are multiples of ``multiple``.

    A frame is ``H x W`` (grey), ``H x W x 1`` (grey), ``H x W x 3`` (RGB) or ``H x W x 4`` (RGBA;
    the alpha is dropped). Booleans are black and white; floats are in [0, 1] if no value of the
    whole video exceeds 1 (deciding per video keeps a dark frame from being read on another
    scale than its neighbours), otherwise in [0, 255]; other values are clipped to [0, 255]."""
    if not frames:
        raise ValueError("no frames to write")
    first = _rgb(np.asarray(frames[0]))
    height, width = first.shape[:2]
    factor = max(1, math.ceil(MIN_SIDE / min(height, width)))
    pad_h = -height * factor % multiple
    pad_w = -width * factor % multiple
    scale = _scale(frames)
    video = np.zeros((len(frames), height * factor + pad_h, width * factor + pad_w, 3), np.uint8)
    rows = slice(pad_h // 2, pad_h // 2 + height * factor)
    cols = slice(pad_w // 2, pad_w // 2 + width * factor)
    for i, frame in enumerate(frames):
        rgb = _rgb(np.asarray(frame))
        if rgb.shape[:2] != (height, width):
            raise ValueError(f"frame {i} is {rgb.shape[:2]}, the first one {(height, width)}")
        big = rgb.repeat(factor, axis=0).repeat(factor, axis=1)
        video[i, rows, cols] = _uint8(big, scale)
    return video


def _rgb(frame: np.ndarray) -> np.ndarray:
    """``frame`` with three channels (grey repeated, alpha dropped), in its own dtype."""
    if frame.ndim == 2:
        frame = frame[..., None]
    if frame.ndim != 3 or frame.shape[-1] not in (1, 3, 4):
        raise ValueError(
            f"a frame must be H x W, or H x W x 1, 3 or 4 channels; got shape {frame.shape}"
        )
    return np.repeat(frame, 3, axis=-1) if frame.shape[-1] == 1 else frame[..., :3]


def _scale(frames: Sequence[np.ndarray]) -> float:
    """What float values are multiplied by to be in [0, 255]: 255 when the whole video is in
    [0, 1], else 1. Other dtypes are not scaled."""
    if not np.issubdtype(np.asarray(frames[0]).dtype, np.floating):
        return 1.0
    peak = max(float(np.nanmax(f, initial=0.0)) for f in frames)
    return 255.0 if peak <= 1.0 else 1.0


def _uint8(frame: np.ndarray, scale: float) -> np.ndarray:
    if frame.dtype == np.uint8:
        return frame
    if frame.dtype == np.bool_:
        return frame.astype(np.uint8) * 255
    if np.issubdtype(frame.dtype, np.floating):
        frame = np.rint(np.nan_to_num(frame.astype(np.float64) * scale))
    return np.clip(frame, 0, 255).astype(np.uint8)
