"""The job store's connections, one per thread, to the backend its URL names, and its write transactions.

`backend_for(url)`: `sqlite:///PATH` (the default, one box: server/store/sqlite.py) or
`postgresql://USER@HOST:PORT/DB` (several boxes sharing one database: server/store/postgres.py). A backend
supplies what differs between the two: connections, the statement that opens a write transaction, the column
types of the schema, the claim's row lock (`FOR UPDATE SKIP LOCKED` on PostgreSQL), how lock waits become
`StoreBusy`, and the checks that refuse a damaged or foreign store with a `StoreError`. Every write runs in
one transaction that takes the write lock (SQLite) or row locks (PostgreSQL) a claim needs to be
exactly-once.
"""

from __future__ import annotations

import contextlib
import threading

from server.store.errors import StoreBusy, StoreError

# Keys of the backend's `lock` (PostgreSQL: advisory locks; SQLite's one writer needs none)
MIGRATIONS_LOCK = 0x17A_C0DE
CREATE_LOCK = 0x17A_C0DF  # creations one at a time: the queue's count is exact, ids numbered in commit order


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


class Connections:
    """What every part of `JobStore` reads and writes through: `_db`, this thread's connection (a new one
    after a lost PostgreSQL connection), and `_write()`, a write transaction on it."""

    def __init__(self, target: str, *, busy_timeout: float = 30.0):
        self.url, self.busy_timeout = target, busy_timeout
        self._backend = backend_for(target, busy_timeout=busy_timeout)
        self.path = self._backend.where  # in messages: the file, or the URL without its password
        self.kind = self._backend.name
        self._local = threading.local()
        self._opened = False

    @property
    def _db(self):
        db = getattr(self._local, "db", None)
        if db is None or getattr(db, "broken", False):  # a lost PostgreSQL connection: a new one
            if db is not None:
                with contextlib.suppress(Exception):  # its socket, which the server may have closed
                    db.close()
            try:
                db = self._local.db = self._backend.connect()
            except StoreError as e:
                if not self._opened:
                    raise  # at start: the server ends with the one line
                raise StoreBusy(f"the job store is unreachable ({e.problem}); retry shortly") from None
        return db

    def _write(self):
        return _WriteTxn(self._db, self._backend.begin)

    def write_probe(self) -> None:
        """An empty write transaction: raises `StoreBusy` where a write would (SQLite's lock held, a full
        disk, PostgreSQL gone), changing nothing."""
        with self._write():
            pass

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None


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
            try:
                self.db.execute("COMMIT")
            except BaseException:  # SQLite keeps the transaction, and its write lock, after a failed
                self._rollback()  # COMMIT (a full disk): every other connection would wait on it for good
                raise
            return
        self._rollback()

    def _rollback(self) -> None:
        try:
            self.db.execute("ROLLBACK")
        except Exception:  # a lost connection takes its transaction with it; the first error tells
            pass
