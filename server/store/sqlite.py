"""The SQLite backend of the job store (the default: `sqlite:///DATA_DIR/jobs.db`).

WAL mode: many readers (status polls) never block the one writer, and several processes on one box (an
API, its worker leaders, a second replica's API) share one file. Every write runs inside `BEGIN IMMEDIATE`
(the write lock is taken up front), so a claim can never race another process's claim; a lock wait longer
than the busy timeout ends in `StoreBusy` (server/store/sqlite_file.py).
"""

from __future__ import annotations

import os
import sqlite3

from server.store.sqlite_file import Connection, check_file


class SqliteBackend:
    """What the SQLite store does differently from PostgreSQL; server/store/ holds the rest."""

    name = "sqlite"
    begin = "BEGIN IMMEDIATE"
    skip_locked = ""  # one writer at a time: nothing to skip
    types = {"pk": "INTEGER PRIMARY KEY AUTOINCREMENT", "float": "REAL"}

    def __init__(self, path: str, busy_timeout: float):
        self.path, self.busy_timeout = path, busy_timeout
        self.where = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        check_file(path)

    def connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout,
            isolation_level=None,
            check_same_thread=False,
            factory=Connection,
        )
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
        return db

    def prepare(self, db: sqlite3.Connection) -> None:
        db.execute("PRAGMA journal_mode=WAL")  # outside a transaction; kept in the file

    def lock(self, db: sqlite3.Connection, key: int) -> None:
        pass  # BEGIN IMMEDIATE already holds the one write lock

    def columns(self, db: sqlite3.Connection, table: str) -> set[str]:
        return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}

    def has_table(self, db: sqlite3.Connection, table: str) -> bool:
        row = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
        return row is not None
