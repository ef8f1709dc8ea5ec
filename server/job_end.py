"""The worker leader's end of a finished job: its MP4's frames are all with ffmpeg, so the rest (wait for the
file, rename it into place, complete the job, count it) runs on a thread of its own (`VideoCloser`) while the
leader claims its next job. Until the file is in place the job stays in progress under its worker: a group
that dies meanwhile has it re-queued, never completed without its file. A job's end is written however long
the store is away (`PatientStore.until_answered`): given up past the grace, it stayed in progress under its
live worker, which nothing re-queues, until --job-timeout."""

from __future__ import annotations

import functools
import logging
import os
from typing import TYPE_CHECKING

from dit.video import VideoNotWritten
from server import metrics, videos
from server.phases import job_timings
from server.store import StoreBusy
from server.store.retry import PatientStore
from server.writers import VideoCloser

if TYPE_CHECKING:
    from server.job_run import JobRun

log = logging.getLogger("ithaca.worker")


class JobEnd:
    def __init__(self, store: PatientStore, name: str, videos_dir: str):
        self.store, self.name, self.videos_dir = store.until_answered, name, videos_dir
        self._once = store.once  # a close asks, while it waits, whether its job was cancelled
        self.closer = VideoCloser()

    def drop_files(self, job_id: str, image: bool) -> None:
        """Remove a deleted job's input image once it is over (the API leaves it while the job runs), and
        any preview written after the API removed it."""
        job = self.store.get(job_id, include_deleted=True)
        if job is not None and job.deleted and job.terminal:
            if image:
                videos.remove_input(self.videos_dir, job_id)
            videos.remove_preview(self.videos_dir, job_id)

    def hand_off(self, run: JobRun, frames, evaluations) -> None:
        """Hand the run's MP4 (encoded during the decode: `writing` is the time after its last frame) to the
        closer, unless the job was cancelled after its last step. `evaluations`: this job's (the next job's
        generate replaces the pipeline's)."""
        if run.on_phase("writing"):
            run.video.drop()
            self.over(run, "cancelled", error="cancelled while decoding; no video was written")
            return
        frames = None if run.video.streamed else frames  # a close waiting its turn holds only what it needs
        self.closer.submit(run.job_id, functools.partial(self._close, run, frames, evaluations))

    def flush(self, timeout: float) -> bool:
        """Wait for the closes handed off; False when `timeout` ran out first."""
        return self.closer.flush(timeout)

    def finish(self, run: JobRun, status: str, **fields):
        """End the job's run with its timings (and any others in `fields["timings"]`), if it is still this
        run (not re-queued and claimed again meanwhile); the job, or None."""
        timings = job_timings(run.start, run.step_times, run.phases) | fields.pop("timings", {})
        if fields.get("error"):  # read by any client: "its disk is full (0 KiB free in /srv/...)" named it
            fields["error"] = fields["error"].replace(self.videos_dir, "the results folder")
        return self.store.finish(
            run.job_id, self.name, status, timings=timings, attempt=run.attempt, **fields
        )

    def over(self, run: JobRun, status: str, **fields):
        """`finish`, and when the job ended in this run, its checkpoint gone: kept until the MP4 was in place,
        so a run killed while the file closed resumes from it (it ran every step again); another run's
        checkpoint stays."""
        job = self.finish(run, status, **fields)
        if job is not None:
            videos.remove_checkpoint(self.videos_dir, run.job_id)
        return job

    def _close(self, run: JobRun, frames, evaluations) -> None:
        """On the closer's thread: finish the file, then complete the job. The file is renamed into place
        before the job completes, so readers of a completed job always find it; a cancel that lands in
        between is found by `finish`, and the file goes again. A close that fails fails the job: its frames
        are gone, and a run again would be a whole new generation for what is most likely a disk's fault. A
        run whose job was re-queued meanwhile (its heartbeats lost, the job claimed again) leaves the name to
        the run after it."""
        job_id, image = run.job_id, "image" in run.spec
        path = os.path.join(self.videos_dir, f"{job_id}.mp4")
        try:
            closed = run.video.close(frames, stopped=lambda: self._cancelled(job_id))
            if closed is None:  # its ffmpeg, held up by a stalled disk, ended: the DELETE waited up to 120 s
                self.over(run, "cancelled", error="cancelled while its MP4 was written; no video was kept")
                self.drop_files(job_id, image)
                return
            if not self.store.running(job_id, self.name, run.attempt):
                log.warning("job %s: no longer this run's (attempt %d); its MP4 goes", job_id, run.attempt)
                run.video.drop()
                return
            os.replace(closed, path)  # readers never see a half-written file
        except Exception as e:
            run.video.drop()
            error = f"the MP4 was not written: {type(e).__name__}: {e}"
            if isinstance(e, VideoNotWritten):  # its one line says why (a full disk)
                error = str(e)
            log.error("job %s: %s", job_id, error)
            self.over(run, "failed", error=error)
            self.drop_files(job_id, image)
            return
        counts = {"evaluated": evaluations.evaluated, "skipped": evaluations.skipped}
        job = self.over(run, "completed", video=os.path.basename(path), timings=counts)
        if job is None or job.status != "completed":  # cancelled meanwhile, or no longer this run's
            os.remove(path)
        else:
            self.store.add_counters(
                metrics.observations(
                    run.step_times, job.finished_at - job.started_at, run.phases.seconds, evaluations
                )
            )
        self.drop_files(job_id, image)  # a job deleted while its file closed is over only now

    def _cancelled(self, job_id: str) -> bool:
        try:
            job = self._once.get(job_id)
        except StoreBusy:  # asked again in a second
            return False
        return job is not None and job.cancel_requested
