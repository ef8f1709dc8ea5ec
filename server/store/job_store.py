"""Durable job store shared by the API process and the worker group, on one of two backends.

`open_store(url)`: `sqlite:///PATH` (the default, one box: server/store/sqlite.py) or
`postgresql://USER@HOST:PORT/DB` (several boxes sharing one database: server/store/postgres.py). The job
rules are written here once, as plain SQL with SQLite's `?`/`?N` parameters, `RETURNING` and
`ON CONFLICT` upserts (both databases take them); a backend supplies what differs: connections, the
statement that opens a write transaction, the column types of the schema, the claim's row lock
(`FOR UPDATE SKIP LOCKED` on PostgreSQL), how lock waits become `StoreBusy`, and the checks that refuse a
damaged or foreign store with a `StoreError`. Each thread gets its own connection; every write runs in one
transaction that takes the write lock (SQLite) or row locks (PostgreSQL) a claim needs to be exactly-once.

The schema is versioned (`schema_version` table, both backends): `_MIGRATIONS` bring a store of any earlier
version, including the SQLite files written before the table existed, to `SCHEMA_VERSION` at open; a store
of a newer version than this code knows is refused.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

from server.store.sqlite_file import OUR_COLUMNS, StoreBusy, StoreError

__all__ = ["IdempotencyConflict", "QueueFull", "Job", "JobStore", "StoreBusy", "StoreError", "open_store",
           "backend_for"]  # fmt: skip
log = logging.getLogger("ithaca.jobs")

ACTIVE = ("queued", "in_progress")
TERMINAL = ("completed", "failed", "cancelled")
STATUSES = ACTIVE + TERMINAL
PHASES = ("queued", "encoding", "denoising", "decoding", "writing")
TIMED_PHASES = PHASES[1:]
# The seconds of each phase: a column each, so a running job shows the phases it has finished and a failed
# one keeps them (the rest of a job's timings is one JSON object written with its terminal state).
PHASE_TIMINGS = tuple(f"{phase}_s" for phase in TIMED_PHASES)
# Progress (0-100) at the start of each phase: denoising steps fill 0..DENOISED, the decode and the MP4
# the rest, so a long decode is not "99 %" for seconds; 100 is reached only on completion.
DENOISED = 90
PHASE_PROGRESS = {"decoding": DENOISED, "writing": 97}


class IdempotencyConflict(ValueError):
    """An idempotency key came back with a different request; `args[0]` is the id of the key's job."""


class QueueFull(Exception):
    """`create` found `max_queued` jobs waiting already; `queued`: how many."""

    def __init__(self, queued: int):
        super().__init__(f"{queued} jobs are queued")
        self.queued = queued


# Keys of the backend's `lock` (PostgreSQL: advisory locks; SQLite's one writer needs none)
MIGRATIONS_LOCK = 0x17A_C0DE
CREATE_LOCK = 0x17A_C0DF  # creations one at a time: the queue's count is exact, ids numbered in commit order


# {pk}, {float}: the backend's column types (`types`)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq {pk},
    id TEXT NOT NULL UNIQUE,
    idempotency_key TEXT UNIQUE,
    status TEXT NOT NULL,
    spec TEXT NOT NULL,
    meta TEXT NOT NULL DEFAULT '{{}}',
    created_at {float} NOT NULL,
    started_at {float},
    finished_at {float},
    step INTEGER NOT NULL DEFAULT 0,
    total_steps INTEGER NOT NULL DEFAULT 0,
    progress INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    deleted INTEGER NOT NULL DEFAULT 0,
    instance TEXT,
    worker TEXT,
    video TEXT,
    timings TEXT,
    error TEXT
);
CREATE INDEX IF NOT EXISTS jobs_status_seq ON jobs (status, seq);
CREATE TABLE IF NOT EXISTS workers (
    worker TEXT PRIMARY KEY,
    instance TEXT NOT NULL,
    group_id TEXT NOT NULL,
    state TEXT NOT NULL,
    info TEXT NOT NULL,
    heartbeat_at {float} NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value {float} NOT NULL);
CREATE TABLE IF NOT EXISTS flags (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
# Columns added after the first release, declared here alone: every store, new or written by an earlier
# version, gains them at open (schema version 2; also any of them a store lacks at the current version).
_ADDED_COLUMNS = {
    "phase": "TEXT NOT NULL DEFAULT 'queued'",
    "request_hash": "TEXT",
    **dict.fromkeys(PHASE_TIMINGS, "{float}"),
    "preview_step": "INTEGER",  # the step of the latest live preview (videos.preview_path); null: none yet
    "resumed_from_step": "INTEGER",  # the checkpoint's step this run went on from; null: from the start
}


def _create_tables(backend, db) -> None:
    for statement in _SCHEMA.format(**backend.types).split(";"):
        if statement.strip():
            db.execute(statement)


def _add_columns(backend, db) -> None:
    have = backend.columns(db, "jobs")
    for name, decl in _ADDED_COLUMNS.items():
        if name not in have:
            db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {decl.format(**backend.types)}")


# Version N of the schema is what _MIGRATIONS[N] makes of version N - 1; a store older than the
# `schema_version` table (an SQLite file of an earlier release) is version 0. Each step may find part of its
# work done (an earlier release added some of the columns): it does the rest.
_MIGRATIONS = {1: _create_tables, 2: _add_columns}
SCHEMA_VERSION = max(_MIGRATIONS)


@dataclass
class Job:
    seq: int
    id: str
    status: str
    spec: dict
    meta: dict
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    step: int = 0
    total_steps: int = 0
    progress: int = 0
    attempts: int = 0
    cancel_requested: bool = False
    deleted: bool = False
    worker: str | None = None
    instance: str | None = None  # the server whose worker group claimed it last (wrote its video)
    video: str | None = None
    timings: dict = field(default_factory=dict)
    error: str | None = None
    phase: str = "queued"
    preview_step: int | None = None
    resumed_from_step: int | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


def _job(row) -> Job | None:
    if row is None:
        return None
    return Job(
        seq=row["seq"],
        id=row["id"],
        status=row["status"],
        spec=json.loads(row["spec"]),
        meta=json.loads(row["meta"]),
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        step=row["step"],
        total_steps=row["total_steps"],
        progress=row["progress"],
        attempts=row["attempts"],
        cancel_requested=bool(row["cancel_requested"]),
        deleted=bool(row["deleted"]),
        worker=row["worker"],
        instance=row["instance"],
        video=row["video"],
        # null for the phases not reached; a job finished by an earlier version has them in its JSON
        timings={c: row[c] for c in PHASE_TIMINGS} | json.loads(row["timings"] or "{}"),
        error=row["error"],
        phase=row["phase"],
        preview_step=row["preview_step"],
        resumed_from_step=row["resumed_from_step"],
    )


def backend_for(url: str, *, busy_timeout: float = 30.0):
    """The backend of a store URL: `sqlite:///PATH` (`sqlite:////abs/path` for an absolute one; a bare path
    is an SQLite file too) or `postgresql://...` / `postgres://...` (libpq's URL: user, password, host,
    port, database, `?host=/socket/folder` ...)."""
    if url.startswith(("postgresql://", "postgres://")):
        from server.store.postgres import PostgresBackend

        return PostgresBackend(url, busy_timeout)
    from server.store.sqlite import SqliteBackend

    if url.startswith("sqlite:///"):
        return SqliteBackend(url.removeprefix("sqlite:///"), busy_timeout)
    if "://" in url:
        raise ValueError(f"unknown job store {url!r}: use sqlite:///PATH or postgresql://USER@HOST:PORT/DB")
    return SqliteBackend(url, busy_timeout)


def open_store(url_or_config, *, busy_timeout: float = 30.0) -> JobStore:
    """The job store at a URL (see `backend_for`), or at a `ServeConfig`'s `store_url`."""
    url = url_or_config if isinstance(url_or_config, str) else url_or_config.store_url
    return JobStore(url, busy_timeout=busy_timeout)


class JobStore:
    """`target`: a store URL or an SQLite file's path (see `backend_for`). `busy_timeout`: seconds a
    statement waits for another process's lock before `StoreBusy` (the API uses a short one so a request
    fails fast with 503; workers wait longer)."""

    def __init__(self, target: str, *, busy_timeout: float = 30.0):
        self.url, self.busy_timeout = target, busy_timeout
        self._backend = backend_for(target, busy_timeout=busy_timeout)
        self.path = self._backend.where  # in messages: the file, or the URL without its password
        self.kind = self._backend.name
        self._local = threading.local()
        self._opened = False
        self._migrate()
        self._opened = True

    def _migrate(self) -> None:
        """Bring the schema to SCHEMA_VERSION (nothing written when it is there already)."""
        backend = self._backend
        backend.prepare(self._db)
        if self._schema_state(self._db) == (SCHEMA_VERSION, True):
            return
        with self._write() as db:
            backend.lock(db, MIGRATIONS_LOCK)  # two processes would collide on DDL
            version, complete = self._schema_state(db)  # again: another process may have migrated meanwhile
            for step in range(version + 1, SCHEMA_VERSION + 1):
                _MIGRATIONS[step](backend, db)
            if not complete:  # a column a later version of the table lost (as a test makes one)
                _add_columns(backend, db)
            if version != SCHEMA_VERSION:
                db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
                db.execute("DELETE FROM schema_version")
                db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
                log.info("job store %s: schema version %d -> %d", self.path, version, SCHEMA_VERSION)

    def _schema_state(self, db) -> tuple[int, bool]:
        """(the store's schema version, whether its jobs table has every column); StoreError for a store
        this code must not write to: a newer version's, or another program's tables."""
        backend = self._backend
        version = 0
        if backend.has_table(db, "schema_version"):
            version = db.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0
        if version > SCHEMA_VERSION:
            raise StoreError(
                self.path,
                f"was written by a newer version of Ithaca (schema version {version}; this one knows up to "
                f"{SCHEMA_VERSION})",
                fix="upgrade this server to the version the others run, or point it at another store",
            )
        columns = backend.columns(db, "jobs")
        if columns and not OUR_COLUMNS <= columns:
            raise StoreError(
                self.path,
                "holds a jobs table of another program",
                fix="point --store at a database of its own",
            )
        return version, set(_ADDED_COLUMNS) <= columns

    # -- connection plumbing -------------------------------------------------------------------------------

    @property
    def _db(self):
        db = getattr(self._local, "db", None)
        if db is None or getattr(db, "broken", False):  # a lost PostgreSQL connection: a new one
            try:
                db = self._local.db = self._backend.connect()
            except StoreError as e:
                if not self._opened:
                    raise  # at start: the server ends with the one line
                raise StoreBusy(f"the job store is unreachable ({e}); retry shortly") from None
        return db

    def _write(self):
        return _WriteTxn(self._db, self._backend.begin)

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    # -- jobs: API side ------------------------------------------------------------------------------------

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
                    if row["request_hash"] not in (None, request_hash):  # None: kept before hashes were
                        raise IdempotencyConflict(row["id"])
                    return _job(row), False
            if max_queued is not None:
                queued = db.execute("SELECT COUNT(*) FROM jobs WHERE status = 'queued'").fetchone()[0]
                if queued >= max_queued:
                    raise QueueFull(queued)
            row = db.execute(
                "INSERT INTO jobs (id, idempotency_key, request_hash, status, spec, meta, created_at) "
                "VALUES (?, ?, ?, 'queued', ?, ?, ?) RETURNING *",
                (
                    job_id or uuid.uuid4().hex,
                    idempotency_key,
                    request_hash,
                    json.dumps(spec),
                    json.dumps(meta or {}),
                    time.time(),
                ),
            ).fetchone()
            return _log_change(_job(row)), True

    def get(self, job_id: str, *, include_deleted: bool = False) -> Job | None:
        deleted = "" if include_deleted else " AND deleted = 0"
        return _job(self._db.execute(f"SELECT * FROM jobs WHERE id = ?{deleted}", (job_id,)).fetchone())

    def is_empty(self) -> bool:
        return self._db.execute("SELECT 1 FROM jobs LIMIT 1").fetchone() is None

    def list(self, *, limit: int, after: str | None = None, order: str = "desc", status: str | None = None):
        """A page of jobs ordered by creation, starting after the job `after`; returns (jobs, has_more)."""
        op, direction = ("<", "DESC") if order == "desc" else (">", "ASC")
        where, args = ["deleted = 0"], []
        if after is not None:
            where.append(f"seq {op} COALESCE((SELECT seq FROM jobs WHERE id = ?), -1)")
            args.append(after)
        if status is not None:
            where.append("status = ?")
            args.append(status)
        rows = self._db.execute(
            f"SELECT * FROM jobs WHERE {' AND '.join(where)} ORDER BY seq {direction} LIMIT ?",
            (*args, limit + 1),
        ).fetchall()
        return [_job(r) for r in rows[:limit]], len(rows) > limit

    def queue_position(self, job: Job) -> int | None:
        """Queued jobs ahead of this one (0 = runs next); None once it left the queue."""
        if job.status != "queued":
            return None
        return self._db.execute(
            "SELECT COUNT(*) FROM jobs WHERE status = 'queued' AND seq < ?", (job.seq,)
        ).fetchone()[0]

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
                "UPDATE jobs SET status = 'cancelled', finished_at = ?, "
                "error = 'cancelled before it started' "
                "WHERE id = ? AND status = 'queued' RETURNING *",
                (time.time(), job_id),
            ).fetchone()
            db.execute(
                "UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND status = 'in_progress'", (job_id,)
            )
            if delete:
                db.execute("UPDATE jobs SET deleted = 1 WHERE id = ?", (job_id,))
            job = _job(db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone())
        if cancelled is not None:
            _log_change(job)
        return job

    # -- jobs: worker side ---------------------------------------------------------------------------------

    def has_queued(self) -> bool:
        """Cheap read-only check so idle polling never takes the write lock."""
        return self._db.execute("SELECT 1 FROM jobs WHERE status = 'queued' LIMIT 1").fetchone() is not None

    def claim(self, worker: str, instance: str) -> Job | None:
        """Atomically move the oldest queued job to in_progress for this worker (None: the queue is empty)."""
        with self._write() as db:
            row = db.execute(
                "UPDATE jobs SET status = 'in_progress', started_at = ?, worker = ?, instance = ?, "
                "attempts = attempts + 1, step = 0, progress = 0, phase = 'encoding', "
                "resumed_from_step = NULL "
                "WHERE seq = (SELECT seq FROM jobs WHERE status = 'queued' ORDER BY seq LIMIT 1"
                f"{self._backend.skip_locked}) AND status = 'queued' RETURNING *",
                (time.time(), worker, instance),
            ).fetchone()
        return _log_change(_job(row))

    def set_spec(self, job_id: str, spec: dict) -> None:
        with self._write() as db:
            db.execute("UPDATE jobs SET spec = ? WHERE id = ?", (json.dumps(spec), job_id))

    def progress(self, job_id: str, worker: str, step: int, total_steps: int) -> bool:
        """Record a finished denoising step; True when the job's cancel flag is set or the job is no longer
        this worker's (failed or re-queued by a supervisor meanwhile)."""
        with self._write() as db:
            row = db.execute(
                "UPDATE jobs SET step = ?, total_steps = ?, progress = ? "
                "WHERE id = ? AND worker = ? AND status = 'in_progress' RETURNING cancel_requested",
                (step, total_steps, DENOISED * step // max(total_steps, 1), job_id, worker),
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
        (`timings`, PHASE_TIMINGS keys); True (stop) as `progress` answers."""
        assert phase in PHASES
        set_timings, seconds = _phase_timings(5, timings)
        with self._write() as db:
            row = db.execute(
                "UPDATE jobs SET phase = ?1, progress = CASE WHEN progress > ?2 THEN progress ELSE ?2 END, "
                f"{set_timings} "
                "WHERE id = ?3 AND worker = ?4 AND status = 'in_progress' RETURNING *",
                (phase, PHASE_PROGRESS.get(phase, 0), job_id, worker, *seconds),
            ).fetchone()
        job = _log_change(_job(row))
        return job is None or job.cancel_requested

    def finish(
        self,
        job_id: str,
        worker: str | None,
        status: str,
        *,
        error: str | None = None,
        video: str | None = None,
        timings: dict | None = None,
    ) -> Job | None:
        """Write the terminal state of a running job, if it is still `worker`'s (None: any worker's); returns
        the job, or None when it was no longer in progress there. A completion finds a cancel that arrived
        after the last step in the same statement and ends the job `cancelled` instead (no video): a DELETE
        either lands before it or finds the job completed, never accepted and then ignored. `timings`: the
        phases' seconds (PHASE_TIMINGS keys; one left out keeps what `set_phase` recorded) and any others."""
        assert status in TERMINAL
        late_cancel = "cancelled after the last step; the video was not kept"
        set_timings, seconds = _phase_timings(9, timings)
        others = json.dumps({k: v for k, v in (timings or {}).items() if k not in PHASE_TIMINGS})
        with self._write() as db:
            row = db.execute(
                "UPDATE jobs SET "
                "status = CASE WHEN ?1 = 'completed' AND cancel_requested <> 0 THEN 'cancelled' ELSE ?1 END, "
                "error = CASE WHEN ?1 = 'completed' AND cancel_requested <> 0 THEN ?2 ELSE ?3 END, "
                "video = CASE WHEN cancel_requested <> 0 THEN NULL ELSE ?4 END, "
                "progress = CASE WHEN ?1 = 'completed' AND cancel_requested = 0 THEN 100 ELSE progress END, "
                f"timings = ?5, finished_at = ?6, {set_timings} "
                "WHERE id = ?7 AND status = 'in_progress' AND (CAST(?8 AS TEXT) IS NULL OR worker = ?8) "
                "RETURNING *",
                (status, late_cancel, error, video, others, time.time(), job_id, worker, *seconds),
            ).fetchone()
        return _log_change(_job(row))

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
        return [_job(r) for r in rows]

    def orphans(self, *, stale_after: float) -> list[Job]:
        """Running jobs whose worker has sent no heartbeat for `stale_after` seconds (or never did), whichever
        server claimed them: their group is gone and no supervisor is left to fail them."""
        rows = self._db.execute(
            "SELECT jobs.* FROM jobs LEFT JOIN workers ON workers.worker = jobs.worker "
            "WHERE jobs.status = 'in_progress' AND jobs.started_at < ? "
            "AND (workers.heartbeat_at IS NULL OR workers.heartbeat_at < ?) ORDER BY jobs.seq",
            (time.time() - stale_after,) * 2,
        ).fetchall()
        return [_job(r) for r in rows]

    def requeue_or_fail(self, job: Job, *, max_attempts: int, reason: str) -> Job | None:
        """Give an interrupted job another run, or fail it once it has used up its attempts; returns it as it
        now is (None: it was no longer running)."""
        with self._write() as db:
            if job.attempts < max_attempts:
                row = db.execute(
                    "UPDATE jobs SET status = 'queued', worker = NULL, started_at = NULL, step = 0, "
                    "progress = 0, phase = 'queued', preview_step = NULL, resumed_from_step = NULL, "
                    f"{_CLEAR_TIMINGS} "
                    "WHERE id = ? AND status = 'in_progress' RETURNING *",
                    (job.id,),
                ).fetchone()
            else:
                row = db.execute(
                    "UPDATE jobs SET status = 'failed', finished_at = ?, error = ? "
                    "WHERE id = ? AND status = 'in_progress' RETURNING *",
                    (time.time(), f"{reason} (after {job.attempts} attempts)", job.id),
                ).fetchone()
        return _log_change(_job(row), reason)

    # -- workers, counters, flags ----------------------------------------------------------------------------

    def heartbeat(self, worker: str, *, instance: str, group_id: str, state: str, info: dict) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO workers (worker, instance, group_id, state, info, heartbeat_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (worker) DO UPDATE SET instance = excluded.instance, "
                "group_id = excluded.group_id, "
                "state = excluded.state, info = excluded.info, heartbeat_at = excluded.heartbeat_at",
                (worker, instance, group_id, state, json.dumps(info), time.time()),
            )

    def workers(self, *, group_id: str | None = None, instance: str | None = None) -> list[dict]:
        """Worker rows, newest heartbeat first."""
        where, args = [], []
        for column, value in (("group_id", group_id), ("instance", instance)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = "SELECT * FROM workers" + (f" WHERE {' AND '.join(where)}" if where else "")
        rows = self._db.execute(sql + " ORDER BY heartbeat_at DESC", args).fetchall()
        return [dict(r) | {"info": json.loads(r["info"])} for r in rows]

    def forget_group(self, group_id: str) -> None:
        """Remove the rows and flags of a worker group that is gone."""
        with self._write() as db:
            db.execute("DELETE FROM workers WHERE group_id = ?", (group_id,))
            db.execute("DELETE FROM flags WHERE name IN (?, ?)", (f"drain:{group_id}", f"error:{group_id}"))

    def prune_workers(self, *, stale_after: float) -> int:
        """Remove worker rows silent for `stale_after` seconds (groups that vanished), keeping the newest row
        so the API still knows the model's last published limits; returns how many went."""
        with self._write() as db:
            return db.execute(
                "DELETE FROM workers WHERE heartbeat_at < ? "
                "AND worker <> (SELECT worker FROM workers ORDER BY heartbeat_at DESC LIMIT 1)",
                (time.time() - stale_after,),
            ).rowcount

    def add_counters(self, deltas: dict[str, float]) -> None:
        with self._write() as db:
            db.executemany(
                "INSERT INTO counters (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value",
                list(deltas.items()),
            )

    def counters(self) -> dict[str, float]:
        return {r[0]: r[1] for r in self._db.execute("SELECT name, value FROM counters").fetchall()}

    def request_drain(self, group_id: str) -> None:
        """Ask a worker group to stop claiming and exit once its running job is done."""
        with self._write() as db:
            db.execute(
                "INSERT INTO flags (name, value) VALUES (?, '1') "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (f"drain:{group_id}",),
            )

    def drain_requested(self, group_id: str) -> bool:
        return self._flag(f"drain:{group_id}") is not None

    def record_error(self, group_id: str, message: str) -> None:
        """Keep the first error a rank of the group reports (the cause; later ones are mostly its echo)."""
        with self._write() as db:
            db.execute(
                "INSERT INTO flags (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
                (f"error:{group_id}", message),
            )

    def group_error(self, group_id: str) -> str | None:
        return self._flag(f"error:{group_id}")

    def _flag(self, name: str) -> str | None:
        row = self._db.execute("SELECT value FROM flags WHERE name = ?", (name,)).fetchone()
        return None if row is None else row[0]


def _phase_timings(first: int, timings: dict | None) -> tuple[str, list]:
    """SQL that sets the phase-seconds columns from the parameters ?first, ?first+1, ..., and their values;
    a phase `timings` leaves out keeps its column."""
    sql = ", ".join(f"{c} = COALESCE(?{first + i}, {c})" for i, c in enumerate(PHASE_TIMINGS))
    return sql, [(timings or {}).get(c) for c in PHASE_TIMINGS]


_CLEAR_TIMINGS = ", ".join(f"{c} = NULL" for c in PHASE_TIMINGS)  # a re-queued job starts its phases afresh


def _log_change(job: Job | None, reason: str | None = None) -> Job | None:
    """One log line per job state change: id, state, phase, seconds since it was claimed (or created)."""
    if job is not None:
        since = job.started_at if job.started_at is not None else job.created_at
        fields = {
            "job": job.id,
            "state": job.status,
            "phase": job.phase,
            "duration_s": round(time.time() - since, 3),
        }
        if job.terminal and job.error:
            fields["error"] = job.error
        if reason:
            fields["reason"] = reason
        log.info(
            "job %s %s (%s) %.1f s%s",
            job.id,
            job.status,
            job.phase,
            fields["duration_s"],
            f": {job.error}" if "error" in fields else "",
            extra={"fields": fields},
        )
    return job


class _WriteTxn:
    """`with store._write() as db:` — one write transaction, opened by the backend's `begin` (SQLite's
    IMMEDIATE takes the write lock up front)."""

    def __init__(self, db, begin: str):
        self.db, self.begin = db, begin

    def __enter__(self):
        self.db.execute(self.begin)
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.db.execute("COMMIT")
            return
        try:
            self.db.execute("ROLLBACK")
        except Exception:  # a lost connection takes its transaction with it; the first error tells
            pass
