"""MP4 in and out through imageio-ffmpeg's bundled ffmpeg: H.264 in yuv420p, which every browser plays."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import imageio_ffmpeg
import numpy as np


def write_mp4(frames: np.ndarray, path: str | Path, fps: int) -> Path:
    """uint8 frames `[F, H, W, 3]` → H.264 yuv420p MP4 at `fps`; H and W even (yuv420p halves chroma)."""
    frames = np.ascontiguousarray(frames, dtype=np.uint8)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [F, H, W, 3], got shape {frames.shape}")
    n, h, w, _ = frames.shape
    if h % 2 or w % 2:
        raise ValueError(f"height and width must be even for yuv420p, got {h}x{w}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = imageio_ffmpeg.write_frames(
        str(path),
        (w, h),
        fps=fps,
        codec="libx264",
        pix_fmt_out="yuv420p",
        macro_block_size=2,  # keep the size as asked: 16-multiples are not required by H.264 itself
        output_params=["-crf", "18"],
    )
    writer.send(None)  # start ffmpeg
    for frame in frames:
        writer.send(frame)
    writer.close()
    return path


@dataclass
class Video:
    frames: np.ndarray  # uint8 [F, H, W, 3]
    fps: float
    codec: str
    pix_fmt: str


def read_mp4(path: str | Path) -> Video:
    """Decode an MP4 back to RGB frames (used by tests and operators checking a result)."""
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    w, h = meta["size"]
    frames = [np.frombuffer(buf, dtype=np.uint8).reshape(h, w, 3) for buf in reader]
    pix_fmt = str(meta.get("pix_fmt", "")).split("(")[0]  # "yuv420p(progressive)" → "yuv420p"
    return Video(np.stack(frames), float(meta["fps"]), str(meta.get("codec", "")), pix_fmt)
