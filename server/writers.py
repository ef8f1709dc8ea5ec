"""The worker leader's file writers: each runs on a thread of its own so a denoising step never waits on a
disk, and writes only the latest item it was handed (a newer one replaces one still waiting). A write that
fails is logged and left out: previews and checkpoints are worth having, never worth failing a job for.

- `PreviewWriter`: a job's live preview image → WebP in `videos/previews/`, then its step in the store.
- `CheckpointWriter`: a job's denoising state → `videos/checkpoints/<job id>.pt` (dit.denoise_state), written
  then renamed, so an interrupted job goes on from its last one.
- `StreamedVideo`: a job's MP4, encoded while the VAE decodes (ffmpeg in its own process takes each latent
  frame's frames as they come), under the partial name until the job completes.
- `VideoCloser`: the end of each job the leader hands off once its frames are with ffmpeg (wait for the file,
  rename it into place, record the job), each on a thread of its own, so the leader claims its next job at
  once.
"""

from __future__ import annotations

import io
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from dit.denoise_state import Checkpointing, DenoiseState, save_file
from dit.files import full_disk
from dit.video import Mp4Writer, write_mp4
from server import videos
from server.store import JobStore

PREVIEW_QUALITY = 70  # WebP: a 256-px preview of pure noise (the worst case) is about 40 KB
log = logging.getLogger("ithaca.worker")


class LatestWriter:
    """`submit(job_id, step, item)` returns at once; the thread runs `write(job_id, step, item)`, the latest
    item of each job (a batch's jobs submit side by side). `flush` waits until nothing is pending or being
    written. `write_s`: the seconds the last write took."""

    what = "item"
    videos_dir: str | None = None  # where it writes: a failed write names a full disk there

    def __init__(self):
        self._cond = threading.Condition()
        self._pending: deque[tuple] = deque()
        self._busy = False
        self._thread: threading.Thread | None = None
        self.write_s = 0.0
        self._failing: str | None = None  # the kind of the last write's failure (None: it was written)

    def write(self, job_id: str, step: int, item) -> None:
        raise NotImplementedError

    def submit(self, job_id: str, step: int, item) -> None:
        with self._cond:
            # this job's older item is superseded; another job's is not
            self._pending = deque(p for p in self._pending if p[0] != job_id)
            self._pending.append((job_id, step, item))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"{self.what}s", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until no item is pending or being written; False when `timeout` ran out first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._pending))
                (job_id, step, item), self._busy = self._pending.popleft(), True
            start = time.perf_counter()
            try:
                self.write(job_id, step, item)
                self.write_s = time.perf_counter() - start
                if self._failing is not None:
                    log.info("%ss are written again (job %s, step %d)", self.what, job_id, step)
                    self._failing = None
            except Exception as e:
                full = full_disk(self.videos_dir)
                # once a kind until one is written again: a full disk said it at every step, for each writer
                # (the kind, not the words: the KiB free in them move)
                kind = "full" if full else type(e).__name__
                if kind != self._failing:
                    log.warning("%s of job %s at step %d not written: %s (said once until one is written)",
                                self.what, job_id, step, full or f"{type(e).__name__}: {e}")  # fmt: skip
                self._failing = kind
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


class PreviewWriter(LatestWriter):
    """Encodes each preview as WebP, puts it in place and records its step on the job (`store`: one that
    waits out an outage, the newest preview then recorded)."""

    what = "preview"

    def __init__(self, store: JobStore, videos_dir: str, worker: str):
        super().__init__()
        self.videos_dir, self.worker = videos_dir, worker
        self.store = store  # its connections are per thread: this one's writes do not share the leader's

    def submit(self, job_id: str, step: int, image: np.ndarray) -> None:
        try:
            image = np.array(image, dtype=np.uint8, copy=True)  # the caller may reuse its buffer
        except Exception as e:  # never the job's failure
            log.warning("preview of job %s at step %d left out: %s: %s", job_id, step, type(e).__name__, e)
            return
        super().submit(job_id, step, image)

    def write(self, job_id: str, step: int, image: np.ndarray) -> None:
        buffer = io.BytesIO()
        Image.fromarray(image).convert("RGB").save(buffer, "WEBP", quality=PREVIEW_QUALITY)
        videos.write_preview(self.videos_dir, job_id, buffer.getvalue())
        self.store.set_preview(job_id, self.worker, step)


class CheckpointWriter(LatestWriter):
    """Saves each (state, key) pair as the job's checkpoint (`capture` already copied the state)."""

    what = "checkpoint"

    def __init__(self, videos_dir: str):
        super().__init__()
        self.videos_dir = videos_dir

    def write(self, job_id: str, step: int, item: tuple[DenoiseState, dict]) -> None:
        state, key = item
        save_file(videos.checkpoint_path(self.videos_dir, job_id), state, key)

    def schedule(self, every: int | None, save: Callable) -> Checkpointing | None:
        """--checkpoint-every's schedule (None: off) for a run whose states go to `save`; a save's write cost
        is this writer's last write (this job's or an earlier one's)."""
        return None if every is None else Checkpointing(every, save, write_cost=lambda: self.write_s)

    def save(self, message: dict, state: DenoiseState) -> None:
        """`state` as the checkpoint of the worker's claimed job `message` (its id and checkpoint key)."""
        self.submit(message["id"], state.step, (state, message["key"]))


class StreamedVideo:
    """`frames(chunk)` as the decode's `on_frames`: the first chunk opens `videos.partial_video` (what
    `videos.sweep` removes if the process dies), each is encoded as it comes. `close()` finishes the file and
    returns its path; `drop()` removes it (a cancel or a failure mid-decode). A write that fails (ffmpeg gone,
    the disk full; the writer keeps it, `Mp4Writer`) or a writer that cannot start is raised by `close`: the
    decode goes on meanwhile, since the group's other ranks are in it too and would wait for this one, and
    the close's failure fails the job (`JobEnd`)."""

    def __init__(self, videos_dir: str, job_id: str, attempt: int, fps: int):
        os.makedirs(videos_dir, exist_ok=True)
        videos.remove_earlier_partials(videos_dir, job_id, attempt)  # left by a run killed as its file closed
        self.path = videos.partial_video(videos_dir, job_id, attempt)
        self.fps, self._writer, self._error = fps, None, None

    def frames(self, chunk: np.ndarray) -> None:
        if self._error is not None:
            return
        try:
            if self._writer is None:
                self._writer = Mp4Writer(self.path, chunk.shape[1], chunk.shape[2], self.fps)
            self._writer.write(chunk)
        except Exception as e:  # ffmpeg could not start
            self._error = e

    @property
    def streamed(self) -> bool:
        """Whether the frames went to ffmpeg as they came (or failed to): `close` then needs none."""
        return self._writer is not None or self._error is not None

    def close(self, frames: np.ndarray | None, stopped: Callable[[], bool] | None = None) -> str | None:
        """The finished file; written from `frames` whole when the pipeline streamed none (a pipeline
        without `on_frames`). `stopped` as `Mp4Writer.close`'s: None, the file gone."""
        if self._error is not None:
            raise self._error
        if self._writer is None:
            return str(write_mp4(frames, self.path, self.fps))
        closed = self._writer.close(stopped)
        return None if closed is None else str(closed)

    def drop(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.abort()
        Path(self.path).unlink(missing_ok=True)


class VideoCloser:
    """Runs each job's close (a callable the worker hands off) on a thread of its own: the MP4's frames are
    all with ffmpeg, so the file finishes while the leader goes on with its next job, and a close that a
    stalled disk holds (up to STALL_S) holds no other job's (in turn, each waited for the one before: N jobs
    N × 120 s, each one's `writing_s` the others' wait)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._running = 0

    def submit(self, job_id: str, close: Callable[[], None]) -> None:
        with self._cond:
            self._running += 1
        threading.Thread(target=self._close, args=(job_id, close), name="MP4 close", daemon=True).start()

    def flush(self, timeout: float) -> bool:
        """Wait until every close handed off is over; False when `timeout` ran out first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._running == 0, timeout)

    def _close(self, job_id: str, close: Callable[[], None]) -> None:
        try:
            close()
        except Exception as e:  # the close records its own failures; one that escapes is only logged
            log.warning("MP4 of job %s not closed: %s: %s", job_id, type(e).__name__, e)
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()
