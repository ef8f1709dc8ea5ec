"""Jobs as the worker groups run them: claimed exactly once, their steps, phases and previews recorded,
ended, and re-queued or failed when their worker is gone."""

from __future__ import annotations

import json
import time

from server.store.connections import Connections
from server.store.job import (
    DENOISED,
    PHASE_PROGRESS,
    PHASE_TIMINGS,
    PHASES,
    TERMINAL,
    Job,
    job_from_row,
    log_change,
)


class JobRuns(Connections):
    """The jobs table as the worker groups use it (a part of `JobStore`)."""

    def has_queued(self) -> bool:
        """Cheap read-only check so idle polling never takes the write lock."""
        return self._db.execute("SELECT 1 FROM jobs WHERE status = 'queued' LIMIT 1").fetchone() is not None

    def claim(self, worker: str, instance: str, *, applied: str = "", patience: float = 0.0) -> Job | None:
        """Atomically move the oldest queued job to in_progress for this worker (None: the queue is empty).
        `applied`: the LoRA set (job.lora_set) the worker has applied; the oldest job of that set goes first
        while every queued job has waited less than `patience` seconds (a switch is saved, and no job
        waits more than `patience` and one job for it)."""
        now = time.time()
        with self._write() as db:
            row = db.execute(
                f"UPDATE jobs SET {_CLAIMED}, batch = 1 "
                "WHERE seq = (SELECT seq FROM jobs WHERE status = 'queued' ORDER BY CASE WHEN lora_set = ?4 "
                "AND (SELECT MIN(created_at) FROM jobs WHERE status = 'queued') > ?5 THEN 0 ELSE 1 END, seq "
                f"LIMIT 1{self._backend.skip_locked}) AND status = 'queued' RETURNING *",
                (now, worker, instance, applied, now - patience),
            ).fetchone()
        return log_change(job_from_row(row))

    def queued_jobs(self, limit: int) -> list[Job]:
        """The oldest `limit` queued jobs, oldest first (a batch's candidates: `join_batch` claims them)."""
        rows = self._db.execute(
            "SELECT * FROM jobs WHERE status = 'queued' ORDER BY seq LIMIT ?", (limit,)
        ).fetchall()
        return [job_from_row(r) for r in rows]

    def join_batch(self, worker: str, instance: str, first: str, ids: list[str]) -> list[Job]:
        """Claim, in one transaction, the jobs of `ids` still queued, for `worker` to run in one batch with
        its running job `first`: one another worker claimed or a cancel ended meanwhile is left out. Every
        job of the batch, `first` included, records how many share it (`batch`). The claimed jobs, in queue
        order."""
        marks = ", ".join(f"?{4 + i}" for i in range(len(ids)))
        with self._write() as db:
            claimed = [row["id"] for row in db.execute(
                f"UPDATE jobs SET {_CLAIMED} WHERE status = 'queued' AND id IN ({marks}) RETURNING id",
                (time.time(), worker, instance, *ids),
            ).fetchall()] if ids else []  # fmt: skip
            batch = [first, *claimed]
            db.execute(
                f"UPDATE jobs SET batch = ? WHERE worker = ? AND status = 'in_progress' "
                f"AND id IN ({', '.join('?' * len(batch))})", (len(batch), worker, *batch),
            )  # fmt: skip
            rows = db.execute(
                f"SELECT * FROM jobs WHERE id IN ({', '.join('?' * len(claimed))}) ORDER BY seq", claimed
            ).fetchall() if claimed else []  # fmt: skip
        return [log_change(job_from_row(row)) for row in rows]

    def set_spec(self, job_id: str, spec: dict) -> None:
        """Record a claimed job's request as validated (the model's defaults filled in): its step count
        shows from then on (`total_steps`; 0 until known)."""
        with self._write() as db:
            db.execute(
                "UPDATE jobs SET spec = ?, total_steps = ? WHERE id = ?",
                (json.dumps(spec), spec.get("num_inference_steps") or 0, job_id),
            )

    def progress(self, job_id: str, worker: str, step: int, total_steps: int) -> bool:
        """Record a finished denoising step; True when the job's cancel flag is set or the job is no longer
        this worker's (failed or re-queued by a supervisor meanwhile). A job whose cancel is asked for keeps
        its progress (as its phase: `set_phase`); its step still counts the steps it ran."""
        with self._write() as db:
            row = db.execute(
                "UPDATE jobs SET step = ?1, total_steps = ?2, "
                "progress = CASE WHEN cancel_requested <> 0 THEN progress ELSE ?3 END "
                "WHERE id = ?4 AND worker = ?5 AND status = 'in_progress' RETURNING cancel_requested",
                (step, total_steps, DENOISED * step // max(total_steps, 1), job_id, worker),
            ).fetchone()
        return row is None or bool(row[0])

    def decoded(self, job_id: str, worker: str, frames: int, total_frames: int) -> bool:
        """Record that a running job's decode has `frames` of its `total_frames` latent frames: its progress
        goes from the decode's start toward the MP4's (PHASE_PROGRESS), and its steps are all done (the last
        step's record may have been superseded unwritten: `LatestStep`); True (stop) as `progress` answers.
        A job whose cancel is asked for keeps its progress."""
        start, end = PHASE_PROGRESS["decoding"], PHASE_PROGRESS["writing"]
        with self._write() as db:
            row = db.execute(
                "UPDATE jobs SET step = total_steps, "
                "progress = CASE WHEN cancel_requested <> 0 OR progress > ?1 THEN progress "
                "ELSE ?1 END WHERE id = ?2 AND worker = ?3 AND status = 'in_progress' "
                "RETURNING cancel_requested",
                (start + (end - start) * frames // max(total_frames, 1), job_id, worker),
            ).fetchone()
        return row is None or bool(row[0])

    def set_resumed(self, job_id: str, worker: str, step: int, total_steps: int) -> None:
        """Record that this run of a claimed job goes on from a checkpoint after `step` steps."""
        with self._write() as db:
            db.execute(
                "UPDATE jobs SET resumed_from_step = ?1, step = ?1, total_steps = ?2, progress = ?3 "
                "WHERE id = ?4 AND worker = ?5 AND status = 'in_progress'",
                (step, total_steps, DENOISED * step // max(total_steps, 1), job_id, worker),
            )

    def set_preview(self, job_id: str, worker: str, step: int) -> bool:
        """Record that the preview of a running job after `step` is in place; False when the job is no
        longer this worker's."""
        with self._write() as db:
            row = db.execute(
                "UPDATE jobs SET preview_step = ? "
                "WHERE id = ? AND worker = ? AND status = 'in_progress' RETURNING id",
                (step, job_id, worker),
            ).fetchone()
        return row is not None

    def set_phase(self, job_id: str, worker: str, phase: str, timings: dict | None = None) -> bool:
        """Record that a running job entered `phase`, and the seconds of the phases it has finished
        (`timings`, PHASE_TIMINGS keys); True (stop) as `progress` answers. A job whose cancel is asked for
        keeps its phase and progress: it stops where it is (cancelled while decoding reads `decoding`)."""
        assert phase in PHASES
        set_timings, seconds = _phase_timings(5, timings)
        with self._write() as db:
            row = db.execute(
                "UPDATE jobs SET phase = CASE WHEN cancel_requested <> 0 THEN phase ELSE ?1 END, "
                "progress = CASE WHEN cancel_requested <> 0 OR progress > ?2 THEN progress ELSE ?2 END, "
                f"{set_timings} "
                "WHERE id = ?3 AND worker = ?4 AND status = 'in_progress' RETURNING *",
                (phase, PHASE_PROGRESS.get(phase, 0), job_id, worker, *seconds),
            ).fetchone()
        job = log_change(job_from_row(row))
        return job is None or job.cancel_requested

    def running(self, job_id: str, worker: str, attempt: int) -> bool:
        """Whether the job is still in progress in this run (`finish`'s condition with `attempt`)."""
        row = self._db.execute(
            "SELECT 1 FROM jobs WHERE id = ? AND status = 'in_progress' AND worker = ? AND attempts = ?",
            (job_id, worker, attempt),
        ).fetchone()
        return row is not None

    def finish(
        self,
        job_id: str,
        worker: str | None,
        status: str,
        *,
        error: str | None = None,
        video: str | None = None,
        timings: dict | None = None,
        attempt: int | None = None,
    ) -> Job | None:
        """Write the terminal state of a running job, if it is still `worker`'s (None: any worker's) and, with
        `attempt`, still in that run (its claim's `attempts`: a run re-queued and claimed again since, by
        this very worker too, is not ended by the earlier run's late end); returns the job, or None when it
        was no longer in progress there. A completion finds a cancel that arrived after the last step in the
        same statement and ends the job `cancelled` instead (no video): a DELETE either lands before it or
        finds the job completed, never accepted and then ignored. `timings`: the phases' seconds
        (PHASE_TIMINGS keys; one left out keeps what `set_phase` recorded) and any others."""
        assert status in TERMINAL
        late_cancel = "cancelled after the last step; the video was not kept"
        set_timings, seconds = _phase_timings(10, timings)
        others = json.dumps({k: v for k, v in (timings or {}).items() if k not in PHASE_TIMINGS})
        with self._write() as db:
            row = db.execute(
                "UPDATE jobs SET "
                "status = CASE WHEN ?1 = 'completed' AND cancel_requested <> 0 THEN 'cancelled' ELSE ?1 END, "
                "error = CASE WHEN ?1 = 'completed' AND cancel_requested <> 0 THEN ?2 ELSE ?3 END, "
                "video = CASE WHEN cancel_requested <> 0 THEN NULL ELSE ?4 END, "
                "progress = CASE WHEN ?1 = 'completed' AND cancel_requested = 0 THEN 100 ELSE progress END, "
                # every step and the MP4 done: an outage dropped the last step's and phase's writes, and a job
                # completed through it read "completed denoising step 6 / 20"
                "step = CASE WHEN ?1 = 'completed' AND cancel_requested = 0 THEN total_steps ELSE step END, "
                "phase = CASE WHEN ?1 = 'completed' AND cancel_requested = 0 THEN 'writing' ELSE phase END, "
                f"timings = ?5, finished_at = ?6, {set_timings} "
                "WHERE id = ?7 AND status = 'in_progress' AND (CAST(?8 AS TEXT) IS NULL OR worker = ?8) "
                "AND (CAST(?9 AS INTEGER) IS NULL OR attempts = ?9) RETURNING *",
                (status, late_cancel, error, video, others, time.time(), job_id, worker, attempt, *seconds),
            ).fetchone()
        return log_change(job_from_row(row))

    def in_progress(self, *, worker_prefix: str | None = None, instance: str | None = None) -> list[Job]:
        where, args = ["status = 'in_progress'"], []
        if worker_prefix is not None:
            where.append("worker LIKE ?")
            args.append(worker_prefix + "%")
        if instance is not None:
            where.append("instance = ?")
            args.append(instance)
        rows = self._db.execute(
            f"SELECT * FROM jobs WHERE {' AND '.join(where)} ORDER BY seq", args
        ).fetchall()
        return [job_from_row(r) for r in rows]

    def orphans(self, *, stale_after: float) -> list[Job]:
        """Running jobs whose worker has sent no heartbeat for `stale_after` seconds (or never did), whichever
        server claimed them: their group is gone and no supervisor is left to fail them."""
        rows = self._db.execute(
            "SELECT jobs.* FROM jobs LEFT JOIN workers ON workers.worker = jobs.worker "
            "WHERE jobs.status = 'in_progress' AND jobs.started_at < ? "
            "AND (workers.heartbeat_at IS NULL OR workers.heartbeat_at < ?) ORDER BY jobs.seq",
            (time.time() - stale_after,) * 2,
        ).fetchall()
        return [job_from_row(r) for r in rows]

    def requeue_or_fail(
        self, job: Job, *, max_attempts: int, reason: str, counted: bool = True
    ) -> Job | None:
        """Give an interrupted job another run, or fail it once it has used up its attempts; returns it as it
        now is (None: it was no longer running). `counted=False`: the run that ended does not count (a server
        shutdown stopped it, its group is gone): the attempt is given back and the job re-queued. A run
        number is then used again, so the caller must know that run can end nothing any more. A job whose
        cancel was asked for ends cancelled: the DELETE was answered, and a run again would only stop."""
        with self._write() as db:
            row = db.execute(
                "UPDATE jobs SET status = 'cancelled', finished_at = ?, error = ?, video = NULL "
                "WHERE id = ? AND status = 'in_progress' AND cancel_requested <> 0 RETURNING *",
                (time.time(), f"cancelled; its run ended before it stopped ({reason})", job.id),
            ).fetchone()
            if row is None and (job.attempts < max_attempts or not counted):
                row = db.execute(
                    "UPDATE jobs SET status = 'queued', attempts = attempts - ?, worker = NULL, "
                    "started_at = NULL, step = 0, progress = 0, phase = 'queued', preview_step = NULL, "
                    "resumed_from_step = NULL, batch = NULL, "
                    f"{_CLEAR_TIMINGS} "
                    "WHERE id = ? AND status = 'in_progress' RETURNING *",
                    (0 if counted else 1, job.id),
                ).fetchone()
            elif row is None:
                row = db.execute(
                    "UPDATE jobs SET status = 'failed', finished_at = ?, error = ? "
                    "WHERE id = ? AND status = 'in_progress' RETURNING *",
                    (time.time(), f"{reason} (after {_attempts(job.attempts)})", job.id),
                ).fetchone()
        return log_change(job_from_row(row), reason)


def _attempts(n: int) -> str:
    return "1 attempt" if n == 1 else f"{n} attempts"


def _phase_timings(first: int, timings: dict | None) -> tuple[str, list]:
    """SQL that sets the phase-seconds columns from the parameters ?first, ?first+1, ..., and their values;
    a phase `timings` leaves out keeps its column."""
    sql = ", ".join(f"{c} = COALESCE(?{first + i}, {c})" for i, c in enumerate(PHASE_TIMINGS))
    return sql, [(timings or {}).get(c) for c in PHASE_TIMINGS]


# a claim's changes, of the parameters ?1 (now), ?2 (the worker) and ?3 (its instance)
_CLAIMED = (
    "status = 'in_progress', started_at = ?1, worker = ?2, instance = ?3, attempts = attempts + 1, step = 0, "
    "progress = 0, phase = 'encoding', resumed_from_step = NULL"
)
_CLEAR_TIMINGS = ", ".join(f"{c} = NULL" for c in PHASE_TIMINGS)  # a re-queued job starts its phases afresh
