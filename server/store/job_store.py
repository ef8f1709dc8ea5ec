"""`JobStore`: the job store's parts (server/store/__init__.py lists them) as one object, opened at a URL."""

from __future__ import annotations

from server.store.counters import Counters
from server.store.flags import GroupFlags
from server.store.queue import JobQueue
from server.store.runs import JobRuns
from server.store.schema import Schema
from server.store.workers import Workers


class JobStore(Schema, JobQueue, JobRuns, Workers, GroupFlags, Counters):
    """`target`: a store URL or an SQLite file's path (see `backend_for`). `busy_timeout`: seconds a
    statement waits for another process's lock before `StoreBusy` (the API uses a short one so a request
    fails fast with 503; workers wait longer)."""

    def __init__(self, target: str, *, busy_timeout: float = 30.0):
        super().__init__(target, busy_timeout=busy_timeout)
        self._migrate()
        self._opened = True


def open_store(url_or_config, *, busy_timeout: float = 30.0) -> JobStore:
    """The job store at a URL (see `backend_for`), or at a `ServeConfig`'s `store_url`."""
    url = url_or_config if isinstance(url_or_config, str) else url_or_config.store_url
    return JobStore(url, busy_timeout=busy_timeout)
