"""MP4 in and out through imageio-ffmpeg's bundled ffmpeg: H.264 in yuv420p, which every browser plays."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import imageio_ffmpeg
import numpy as np

from dit.files import full_disk
from parallel.parent_death import with_parent

# x264's preset at CRF 18 (quality fixed, so a preset trades seconds for bytes), chosen by bench/mp4.py: on
# 81 frames of 480×832, veryfast took 0.41 s for 0.72 MB where the default (medium) took 1.02 s for 0.74 MB
# (2-core CPU box, 2026-11-25; bench/RESULTS.md)
PRESET = "veryfast"


# ffmpeg takes frames as fast as x264 encodes them, and after the last one encodes what x264 held back and
# writes the file's index: a second or so. One that takes no frame, or does not finish, for this long has a
# stalled disk under it: it must not hold the decode (and the group's other ranks in it), the job, and every
# job closing after it, until --job-timeout.
STALL_S = 120.0
STOP_POLL_S = 1.0  # how often a close asks whether its job was cancelled meanwhile


class VideoNotWritten(OSError):
    """The MP4 could not be written; the message says why in one line (a full disk, or ffmpeg's own last
    line), not ffmpeg's command line."""


class Mp4Writer:
    """An H.264 yuv420p MP4 written as frames come: ffmpeg encodes in its own process while the caller makes
    the next ones (a decode chunk by chunk), so the file is closed soon after the last frame. A write that
    fails (ffmpeg gone, the disk full) is kept and raised by `close` as `VideoNotWritten`: the caller's decode
    goes on meanwhile, as the other ranks decoding with it would wait for this one. `close` also fails when
    ffmpeg ends with an error after the last frame (x264 writes most of a short file, and its index, only
    then). An ffmpeg that stalls (its disk does), mid-file or at the close, is ended after STALL_S, and the
    close raises that. A with-block that ends in an exception, its own or the close's, removes the partial
    file. ffmpeg dies with the thread that started it (Linux's parent-death signal is a thread's): a caller
    killed leaves no ffmpeg to finish its file later."""

    def __init__(self, path: str | Path, height: int, width: int, fps: int, preset: str = PRESET):
        if height % 2 or width % 2:
            raise ValueError(f"height and width must be even for yuv420p, got {height}x{width}")
        self.path, self.shape = Path(path), (height, width, 3)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._ffmpeg = subprocess.Popen(
            [imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-v", "error", "-f", "rawvideo", "-pix_fmt", "rgb24",
             "-s", f"{width}x{height}", "-r", str(fps), "-i", "-", "-an", "-c:v", "libx264",
             "-pix_fmt", "yuv420p", "-crf", "18", "-preset", preset, str(self.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # the caller's Ctrl-C does not cut the file short: the caller ends it
            **with_parent(),  # a killed caller's ffmpeg wrote its file later: a stray partial MP4
        )  # fmt: skip
        os.set_blocking(self._ffmpeg.stdin.fileno(), False)  # a write waits on `poll`, for STALL_S at most
        self._said: deque[str] = deque(maxlen=4)  # ffmpeg's last lines: why it failed
        self._reader = threading.Thread(target=self._read, name="ffmpeg-stderr", daemon=True)
        self._reader.start()
        self.frames = 0
        self.error: VideoNotWritten | None = None
        self._closed = False

    def _read(self) -> None:
        for line in self._ffmpeg.stderr:
            if line.strip():
                self._said.append(line.decode(errors="replace").strip())

    def write(self, frames: np.ndarray) -> None:
        """uint8 frames `[n, H, W, 3]` at the size given."""
        frames = np.ascontiguousarray(frames, dtype=np.uint8)
        if frames.ndim != 4 or frames.shape[1:] != self.shape:
            height, width, _ = self.shape
            raise ValueError(f"frames must be uint8 [n, {height}, {width}, 3], got {frames.shape}")
        if self.error is None:
            try:
                self._send(memoryview(frames.reshape(-1)))
            except VideoNotWritten as e:
                self.error = e
            except OSError as e:  # ffmpeg gone: a broken pipe; why is in its exit and last line
                self.error = self._not_written(f"{type(e).__name__}: {e}")
        self.frames += len(frames)

    def _send(self, data: memoryview) -> None:
        fd = self._ffmpeg.stdin.fileno()
        ready = select.poll()  # not select.select: it takes no descriptor past 1023 (a busy server's)
        ready.register(fd, select.POLLOUT)
        while data:
            try:
                data = data[os.write(fd, data) :]
            except BlockingIOError:  # the pipe is full: ffmpeg is behind, or stalled
                if not ready.poll(STALL_S * 1000):
                    self._end()
                    self._closed = True  # the close has nothing to wait for, and keeps this reason
                    why = f"ffmpeg did not take the next frames within {STALL_S:g} s"
                    raise self._not_written(why) from None

    def close(self, stopped: Callable[[], bool] | None = None) -> Path | None:
        """Wait for ffmpeg to finish the file; VideoNotWritten when it could not. `stopped()`, asked each
        second of the wait: True ends ffmpeg and removes the file (`abort`), and the close returns None."""
        if not self._closed:
            self._closed = True
            with contextlib.suppress(OSError):  # a broken pipe: ffmpeg's exit says why
                self._ffmpeg.stdin.close()
            try:
                code = self._wait(stopped)
                if code is None:
                    self.abort()
                    return None
            except subprocess.TimeoutExpired:
                self._end()
                self.error = self._not_written(
                    f"ffmpeg did not finish the file within {STALL_S:g} s of its last frame"
                )
            else:
                self._reader.join()
                if code != 0:
                    how = f"signal {-code}" if code < 0 else f"exit code {code}"
                    self.error = self._not_written(f"ffmpeg ended with {how}", last=True)
        if self.error is not None:
            raise self.error
        return self.path

    def _wait(self, stopped: Callable[[], bool] | None) -> int | None:
        """ffmpeg's exit code, waited for STALL_S at most (TimeoutExpired past it); None once `stopped()`."""
        deadline = time.monotonic() + STALL_S
        while True:
            left = max(deadline - time.monotonic(), 0.0)
            try:
                return self._ffmpeg.wait(left if stopped is None else min(left, STOP_POLL_S))
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise
                if stopped():
                    return None

    def abort(self) -> None:
        """Stop ffmpeg at once and remove the file (a cancel: no one will watch it), a close under way too."""
        self._closed = True
        if self._ffmpeg.returncode is None:
            self._end()
        self.path.unlink(missing_ok=True)

    def _end(self) -> None:
        self._ffmpeg.kill()
        self._ffmpeg.wait()
        with contextlib.suppress(OSError):  # a broken pipe now
            self._ffmpeg.stdin.close()
        self._reader.join()

    def _not_written(self, why: str, last: bool = False) -> VideoNotWritten:
        said = f": {self._said[-1]}" if last and self._said else ""
        return VideoNotWritten(f"the MP4 was not written: {full_disk(self.path.parent) or why + said}")

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(self, kind, error, trace) -> None:
        if kind is not None:  # the block's own error is the one to tell
            self.abort()
            return
        try:
            self.close()
        except BaseException:  # VideoNotWritten, or a Ctrl-C while ffmpeg finished: no file, no ffmpeg left
            self.abort()
            raise


def write_mp4(frames: np.ndarray, path: str | Path, fps: int, preset: str = PRESET) -> Path:
    """uint8 frames `[F, H, W, 3]` → H.264 yuv420p MP4 at `fps`; H and W even (yuv420p halves chroma).
    ValueError naming the argument for what ffmpeg would refuse in its own words (an fps of 0, a path not
    .mp4) or take in silence (float frames in 0-1: a black video)."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [F, H, W, 3], got shape {frames.shape}")
    if frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 [F, H, W, 3] (0 to 255), got {frames.dtype}")
    if isinstance(fps, bool) or not isinstance(fps, int | float | np.number) or not 0 < fps < 1000:
        raise ValueError(f"fps must be a number of frames a second above 0, got {fps!r}")
    if Path(path).suffix.lower() != ".mp4":
        raise ValueError(f"path must end in .mp4, got {str(path)!r}")
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
