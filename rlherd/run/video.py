"""Writing frames to a GIF or MP4 (``rlherd eval --video``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlherd.run.config import MissingExtra


def write_video(path: Path, frames: list[np.ndarray], fps: int = 30) -> None:
    try:
        import imageio.v3 as iio
    except ImportError as e:
        raise MissingExtra("videos need imageio: pip install 'rlherd[video]'") from e
    if path.suffix.lower() == ".gif":
        iio.imwrite(path, np.stack(frames), duration=1000 / fps, loop=0)
    else:
        try:
            iio.imwrite(path, np.stack(frames), fps=fps)
        except (ImportError, OSError, ValueError) as e:
            raise MissingExtra(
                f"could not write {path}: {e}. MP4 needs imageio-ffmpeg (pip install "
                "'rlherd[video]'); a .gif works with the base install"
            ) from e
