"""One job's run as the worker's replica leader records it, alone or in a batch: its steps (each recorded,
its cancel flag read back), phases and their seconds, previews and MP4 (`StreamedVideo`), and its end:
cancelled or failed for a reason of its own (file dropped), handed off to `JobEnd` once decoded, or left in
progress when the group failed (the supervisor re-queues it once the group is gone)."""

from __future__ import annotations

import logging
import time

import numpy as np

from dit.batch import BatchJob
from dit.failures import DecodeCancelled
from dit.preview import frame_preview
from server.phases import PhaseClock
from server.writers import StreamedVideo

log = logging.getLogger("ithaca.worker")


class JobRun:
    def __init__(self, worker, message: dict):
        """`message`: the worker's claimed job (its id, spec and `attempt`, the claim's attempts)."""
        self.worker, self.attempt = worker, message["attempt"]
        self.job_id, self.spec = message["id"], message["spec"]
        worker.steps.start(self.job_id)  # an earlier run of the job told to stop does not stop this one
        self.step_times: list[float] = []
        self.phases = PhaseClock()
        self.recorded = "encoding"  # the phase the claim recorded (server.store.runs)
        self.start = self._last = time.perf_counter()
        self.video = StreamedVideo(worker.config.videos_dir, self.job_id, self.attempt, self.spec["fps"])
        self.over = False  # `ended`

    def callback(self, step: int, total: int) -> bool:
        now = time.perf_counter()
        self.step_times.append(now - self._last)
        self._last = now
        return not self.worker.steps.record(self.job_id, step, total) and not self.worker.torn_down()

    def decode_callback(self, frames: int, total: int) -> bool:
        """The decode's progress recorded, the cancel flag read back (`callback` for the decode's chunks)."""
        return not self.worker.steps.decoded(self.job_id, frames, total)

    def on_phase(self, phase: str) -> bool:
        """The job entered `phase`; True: it must stop (cancelled, or no longer this run's), as far as the
        store's last answer knows (an outage does not hold it: `LatestStep`)."""
        self.phases.enter(phase)
        if phase == "denoising":
            self._last = time.perf_counter()  # the first step's time leaves the text encoding out
        if phase == self.recorded:  # one store write, and one log line, a change
            return False
        self.recorded = phase
        return self.worker.steps.phase(self.job_id, phase, self.phases.timings)

    def batch_job(self, request) -> BatchJob:
        """This job in a batch (`Pipeline.generate_batch`), its callbacks this run's: it ends (`ended`) as
        soon as its outcome is known, not when the batch's last job does."""
        on_end = lambda outcome: self.ended(outcome, self.worker.pipe.evaluations)  # noqa: E731
        return BatchJob(
            request, self.callback, self.on_preview, self.video.frames, self.on_phase, on_end,
            decode_callback=self.decode_callback,
        )  # fmt: skip

    def on_batch_phase(self, phase: str) -> None:
        """A phase of the batch this job is in: its own, but for the batch's decoding, where the job waits
        (its clock stopped) until its own decode begins (`on_phase`, from dit.batch)."""
        if phase == "decoding":
            self.phases.enter(None)
        else:
            self.on_phase(phase)

    def _requeued(self) -> None:
        """Stopped as its group goes (`Worker.torn_down`): queued again, this attempt not counted, its
        checkpoint kept for the run that resumes it, if the job is still this run's."""
        worker = self.worker
        self.video.drop()
        worker._flush()  # the checkpoint being written lands first
        job = worker.store.get(self.job_id)
        if job is not None and job.worker == worker.name and job.attempts == self.attempt:
            reason = "its worker group stopped (another of its ranks failed)"
            max_attempts = worker.config.max_attempts  # not counted: the job is queued again whatever
            worker.store.requeue_or_fail(job, max_attempts=max_attempts, reason=reason, counted=False)

    def on_preview(self, step: int, image: np.ndarray) -> None:
        self.worker.previews.submit(self.job_id, step, image)

    def ended(self, outcome, evaluations) -> None:
        """The run's end: its frames (the thumbnail, a frame of them, in place, then the MP4 handed off to be
        closed), or the GenerationCancelled or GenerationFailed that stopped it (no file; a failure is the
        job's own: no other attempt)."""
        worker, job_id = self.worker, self.job_id
        self.over = True
        if isinstance(outcome, worker.module.GenerationCancelled) and worker.torn_down():
            self._requeued()
            return
        if isinstance(outcome, Exception):
            self.video.drop()
            worker._flush()
            if isinstance(outcome, worker.module.GenerationCancelled):
                steps = f"after step {outcome.step}"  # of the job: a resumed run's own count starts late
                error = f"cancelled {'while decoding' if isinstance(outcome, DecodeCancelled) else steps}"
                ended = worker.ending.over(self, "cancelled", error=error)
            else:
                ended = worker.ending.over(self, "failed", error=str(outcome))
            if ended is None:  # its checkpoint is the next run's: a stale run deleted it, and said nothing
                log.warning("job %s: a run of attempt %d stopped, the job being no longer its (queued again "
                            "while this worker did not answer)", job_id, self.attempt)  # fmt: skip
            return
        worker.previews.submit(job_id, self.spec["num_inference_steps"], frame_preview(outcome))
        worker._flush()  # the checkpoint stays until the MP4 is in place: a run killed meanwhile resumes
        worker.ending.hand_off(self, outcome, evaluations)
