"""The tables of the job store and their migrations.

The schema is versioned (`schema_version` table, both backends): `_MIGRATIONS` bring a store of any earlier
version, including the SQLite files written before the table existed, to `SCHEMA_VERSION` at open; a store
of a newer version than this code knows is refused, and so is a database whose `jobs` table is another
program's.
"""

from __future__ import annotations

import logging

from server.store.connections import MIGRATIONS_LOCK, Connections
from server.store.errors import StoreError
from server.store.job import OUR_COLUMNS, PHASE_TIMINGS

log = logging.getLogger("ithaca.jobs")


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
    "lora_set": "TEXT NOT NULL DEFAULT ''",  # the request's LoRAs (job.lora_set): claims prefer the applied
    "batch": "INTEGER",  # how many jobs shared this run's forwards (1: alone); null until claimed
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


class Schema(Connections):
    """Opening a store: its schema brought to `SCHEMA_VERSION`, or the store refused."""

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
            # ours: one INTEGER column, and a jobs table beside it (Flyway's of old has text versions: a
            # TypeError; another's number read as ours: an UndefinedTable migrating a jobs table not there)
            ours = backend.columns(db, "schema_version") == {"version"}
            if ours:
                version = db.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0
            if not ours or not isinstance(version, int) or version and not backend.columns(db, "jobs"):
                raise StoreError(
                    self.path,
                    "holds a schema_version table of another program",
                    fix="point --store at a database of its own",
                )
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
