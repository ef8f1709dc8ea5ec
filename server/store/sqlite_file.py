"""The file under the job store's SQLite backend: a check that it is one of ours before anything writes to
it, and connections whose lock waits end in `StoreBusy` instead of an `OperationalError` deep in a route.

A truncated, half-written or foreign file where `jobs.db` should be must stop the server with one line that
names the path, what is wrong and what to do; writing our tables into another program's database, or
serving from a damaged one, would lose jobs silently.
"""

from __future__ import annotations

import os
import sqlite3

from server.store.errors import StoreBusy, StoreError, disk_full
from server.store.job import OUR_COLUMNS


class Connection(sqlite3.Connection):
    """A connection that turns SQLite's lock time-outs into `StoreBusy`."""

    def execute(self, *args):
        try:
            return super().execute(*args)
        except sqlite3.OperationalError as e:
            raise _busy_or(e) from e

    def executemany(self, *args):
        try:
            return super().executemany(*args)
        except sqlite3.OperationalError as e:
            raise _busy_or(e) from e


def _busy_or(error: sqlite3.OperationalError) -> Exception:
    message = str(error)
    if "locked" in message or "busy" in message:
        return StoreBusy(f"the job store is locked by another process ({message}); retry shortly")
    if getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:  # one raised by SQLite itself
        return disk_full(message)
    return error


def check_file(path: str) -> None:
    """Raise StoreError unless `path` is missing, empty, or a healthy SQLite database whose `jobs` table (if
    any) is ours. The file is read through SQLite only: closing a plain file handle on it would drop every
    lock SQLite holds on it in this process, and other processes would then rebuild the WAL index under it."""
    if os.path.isdir(path):
        # not "move it aside": the folder is likely where the file was meant to go
        meant = os.path.join(path, "jobs.db")
        raise StoreError(path, "is a folder, not a file", fix=f"name a file in it ({meant}?)")
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return  # SQLite makes a new database of it
    try:
        db = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=30.0)
        try:
            result = db.execute("PRAGMA quick_check").fetchone()[0]
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            columns = {r[1] for r in db.execute("PRAGMA table_info(jobs)")}
        finally:
            db.close()
    except sqlite3.DatabaseError as e:  # "file is not a database", "database disk image is malformed"
        raise StoreError(path, f"is not a SQLite database or is damaged ({e})") from None
    if result != "ok":
        raise StoreError(path, f"is damaged (integrity check: {result})")
    if tables - {"sqlite_sequence"} and not OUR_COLUMNS <= columns:
        raise StoreError(path, f"belongs to another program (tables: {', '.join(sorted(tables))})")
