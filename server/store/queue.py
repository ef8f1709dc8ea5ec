"""Jobs as the API sees them: submitted (once per idempotency key, within the queue's limit), read, listed,
counted, cancelled and deleted."""

from __future__ import annotations

import json
import time
import uuid

from server.store.connections import CREATE_LOCK, Connections
from server.store.errors import IdempotencyConflict, QueueFull, UnknownCursor
from server.store.job import STATUSES, Job, job_from_row, log_change, lora_set


class JobQueue(Connections):
    """The jobs table as the API uses it (a part of `JobStore`)."""

    def create(
        self,
        spec: dict,
        *,
        meta: dict | None = None,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
        job_id: str | None = None,
        max_queued: int | None = None,
    ) -> tuple[Job, bool]:
        """Insert a queued job (its id `job_id`, or a fresh one: a caller names it to write the job's files
        before the job can be claimed). A known idempotency key returns its job instead (created=False), or
        raises IdempotencyConflict when it came with another request (`request_hash`). A deleted job's key
        is free again. QueueFull when `max_queued` jobs wait already: counted in the inserting transaction,
        with creations one at a time (`CREATE_LOCK`), so concurrent submits never overshoot it and jobs are
        numbered in the order they commit (queue positions are unique)."""
        with self._write() as db:
            self._backend.lock(db, CREATE_LOCK)
            if idempotency_key is not None:
                row = db.execute(
                    "SELECT * FROM jobs WHERE idempotency_key = ?", (idempotency_key,)
                ).fetchone()
                if row is not None and row["deleted"]:
                    db.execute("UPDATE jobs SET idempotency_key = NULL WHERE seq = ?", (row["seq"],))
                elif row is not None:
                    if not _same_request(row, request_hash):
                        raise IdempotencyConflict(row["id"])
                    return job_from_row(row), False
            if max_queued is not None:
                queued = db.execute("SELECT COUNT(*) FROM jobs WHERE status = 'queued'").fetchone()[0]
                if queued >= max_queued:
                    raise QueueFull(queued)
            row = db.execute(
                "INSERT INTO jobs (id, idempotency_key, request_hash, status, spec, meta, created_at, "
                "lora_set) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?) RETURNING *",
                (
                    job_id or uuid.uuid4().hex,
                    idempotency_key,
                    request_hash,
                    json.dumps(spec),
                    json.dumps(meta or {}),
                    time.time(),
                    lora_set(spec.get("loras")),
                ),
            ).fetchone()
        return log_change(job_from_row(row)), True  # once committed: a failed commit queued nothing

    def replayed(self, idempotency_key: str, request_hash: str) -> Job | None:
        """The job a known idempotency key came with this very request (`create` would return it), or None."""
        row = self._db.execute(
            "SELECT * FROM jobs WHERE idempotency_key = ? AND deleted = 0", (idempotency_key,)
        ).fetchone()
        return job_from_row(row) if row is not None and _same_request(row, request_hash) else None

    def get(self, job_id: str, *, include_deleted: bool = False) -> Job | None:
        deleted = "" if include_deleted else " AND deleted = 0"
        return job_from_row(
            self._db.execute(f"SELECT * FROM jobs WHERE id = ?{deleted}", (job_id,)).fetchone()
        )

    def is_empty(self) -> bool:
        return self._db.execute("SELECT 1 FROM jobs LIMIT 1").fetchone() is None

    def list(self, *, limit: int, after: str | None = None, order: str = "desc", status: str | None = None):
        """A page of jobs ordered by creation, starting after the job `after` (UnknownCursor if there never
        was one); returns (jobs, has_more)."""
        op, direction = ("<", "DESC") if order == "desc" else (">", "ASC")
        where, args = ["deleted = 0"], []
        if after is not None:
            row = self._db.execute("SELECT seq FROM jobs WHERE id = ?", (after,)).fetchone()
            if row is None:
                raise UnknownCursor(after)
            where.append(f"seq {op} ?")
            args.append(row[0])
        if status is not None:
            where.append("status = ?")
            args.append(status)
        rows = self._db.execute(
            f"SELECT * FROM jobs WHERE {' AND '.join(where)} ORDER BY seq {direction} LIMIT ?",
            (*args, limit + 1),
        ).fetchall()
        return [job_from_row(r) for r in rows[:limit]], len(rows) > limit

    def queue_position(self, job: Job) -> int | None:
        """Queued jobs ahead of this one (0 = first in line; a job of the LoRA set a replica has applied may
        still go first: `JobRuns.claim`); None once it left the queue."""
        if job.status != "queued":
            return None
        return self._db.execute(
            "SELECT COUNT(*) FROM jobs WHERE status = 'queued' AND seq < ?", (job.seq,)
        ).fetchone()[0]

    def expired(self, finished_before: float, limit: int = 500) -> list[Job]:
        """Up to `limit` jobs over (completed, failed or cancelled) and not deleted that finished before
        `finished_before` (time.time()), oldest first: what --keep-hours deletes (server/retention.py)."""
        rows = self._db.execute(
            "SELECT * FROM jobs WHERE deleted = 0 AND status IN ('completed', 'failed', 'cancelled') "
            "AND finished_at < ? ORDER BY seq LIMIT ?",
            (finished_before, limit),
        ).fetchall()
        return [job_from_row(row) for row in rows]

    def counts(self) -> dict[str, int]:
        """Jobs by state; deleted jobs (the /v1 DELETE) are gone for every reader, metrics included."""
        rows = self._db.execute(
            "SELECT status, COUNT(*) FROM jobs WHERE deleted = 0 GROUP BY status"
        ).fetchall()
        return {s: 0 for s in STATUSES} | {r[0]: r[1] for r in rows}

    def queued_count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM jobs WHERE status = 'queued'").fetchone()[0]

    def cancel(self, job_id: str, *, delete: bool = False) -> Job | None:
        """A queued job is cancelled at once; a running one gets its cancel flag, which the worker honours
        at its next step or, past the last step, before it writes the video. Returns the job as it stands
        after the change: a job already completed or failed is left as it was."""
        with self._write() as db:
            cancelled = db.execute(
                "UPDATE jobs SET status = 'cancelled', cancel_requested = 1, finished_at = ?, "
                "error = CASE WHEN attempts > 0 "
                "THEN 'cancelled while queued to run again' ELSE 'cancelled before it started' END "
                "WHERE id = ? AND status = 'queued' RETURNING *",
                (time.time(), job_id),
            ).fetchone()
            db.execute(
                "UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND status = 'in_progress'", (job_id,)
            )
            if delete:
                db.execute("UPDATE jobs SET deleted = 1 WHERE id = ?", (job_id,))
            job = job_from_row(db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone())
        if cancelled is not None:
            log_change(job)
        return job


def _same_request(row, request_hash: str | None) -> bool:
    """Whether a job's idempotency key came with this request (None: kept before hashes were)."""
    return row["request_hash"] in (None, request_hash)
