"""MP4 in and out through imageio-ffmpeg's bundled ffmpeg: H.264 in yuv420p, which every browser plays."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import imageio_ffmpeg
import numpy as np

from dit.files import full_disk

# x264's preset at CRF 18 (quality fixed, so a preset trades seconds for bytes), chosen by bench/mp4.py: on
# 81 frames of 480×832, veryfast took 0.41 s for 0.72 MB where the default (medium) took 1.02 s for 0.74 MB
# (2-core CPU box, 2026-11-25; bench/RESULTS.md)
PRESET = "veryfast"


class VideoNotWritten(OSError):
    """The MP4 could not be written; the message says why in one line (ffmpeg's own error reaches us only as
    a broken pipe, and its command line and output are no message for a user)."""


class Mp4Writer:
    """An H.264 yuv420p MP4 written as frames come: ffmpeg encodes in its own process while the caller makes
    the next ones (a decode chunk by chunk), so the file is closed soon after the last frame. A write that
    fails (ffmpeg gone, the disk full) is kept and raised by `close` as `VideoNotWritten`: the caller's decode
    goes on meanwhile, as the other ranks decoding with it would wait for this one. A with-block that ends in
    an exception, its own or the close's, removes the partial file."""

    def __init__(self, path: str | Path, height: int, width: int, fps: int, preset: str = PRESET):
        if height % 2 or width % 2:
            raise ValueError(f"height and width must be even for yuv420p, got {height}x{width}")
        self.path, self.shape = Path(path), (height, width, 3)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = imageio_ffmpeg.write_frames(
            str(self.path),
            (width, height),
            fps=fps,
            codec="libx264",
            pix_fmt_out="yuv420p",
            macro_block_size=2,  # keep the size as asked: 16-multiples are not required by H.264 itself
            output_params=["-crf", "18", "-preset", preset],
        )
        self._writer.send(None)  # start ffmpeg
        self.frames = 0
        self.error: VideoNotWritten | None = None

    def write(self, frames: np.ndarray) -> None:
        """uint8 frames `[n, H, W, 3]` at the size given."""
        frames = np.ascontiguousarray(frames, dtype=np.uint8)
        if frames.ndim != 4 or frames.shape[1:] != self.shape:
            height, width, _ = self.shape
            raise ValueError(f"frames must be uint8 [n, {height}, {width}, 3], got {frames.shape}")
        if self.error is not None:
            return
        try:
            for frame in frames:
                self._writer.send(frame)
        except Exception as e:
            self.error = self._not_written(e)
        self.frames += len(frames)

    def close(self) -> Path:
        """Wait for ffmpeg to finish the file; VideoNotWritten when it could not."""
        try:
            self._writer.close()
        except Exception as e:
            self.error = self.error or self._not_written(e)
        if self.error is not None:
            raise self.error
        return self.path

    def _not_written(self, error: Exception) -> VideoNotWritten:
        first = (str(error).strip().splitlines() or [""])[0]  # not the ffmpeg command and output after it
        why = full_disk(self.path.parent) or f"ffmpeg stopped ({type(error).__name__}: {first})"
        not_written = VideoNotWritten(f"the MP4 was not written: {why}")
        not_written.__cause__ = error
        return not_written

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(self, kind, error, trace) -> None:
        try:
            self.close()
        except VideoNotWritten:
            self.path.unlink(missing_ok=True)
            if kind is None:
                raise
            return  # the block's own error is the one to tell
        if kind is not None:
            self.path.unlink(missing_ok=True)


def write_mp4(frames: np.ndarray, path: str | Path, fps: int, preset: str = PRESET) -> Path:
    """uint8 frames `[F, H, W, 3]` → H.264 yuv420p MP4 at `fps`; H and W even (yuv420p halves chroma)."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [F, H, W, 3], got shape {frames.shape}")
    with Mp4Writer(path, frames.shape[1], frames.shape[2], fps, preset) as writer:
        writer.write(frames)
    return writer.path


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
