"""Durable job store shared by the API process and the worker group, on one of two backends.

`open_store(url)`: `sqlite:///PATH` (the default, one box) or `postgresql://USER@HOST:PORT/DB` (several
boxes sharing one database). The job rules are written once, as plain SQL with SQLite's `?`/`?N`
parameters, `RETURNING` and `ON CONFLICT` upserts (both databases take them); a backend supplies what
differs. Each thread gets its own connection; every write runs in one transaction.

The rooms:
- job_store.py   `JobStore`, the parts below as one object, and `open_store`
- connections.py the backend of a URL, a connection per thread, write transactions
- schema.py      the tables, their versions and migrations, the refusal of a newer or foreign store
- job.py         `Job`, its states and phases, and the log line of each change
- queue.py       jobs on the API side: create (idempotency, queue limit), read, list, count, cancel
- runs.py        jobs on the worker side: claim, steps, phases, previews, finish, re-queue, orphans
- workers.py     the workers' heartbeats; flags.py: drains and group errors; counters.py: /metrics totals
- errors.py      `StoreBusy` (`StoreFull`: its disk), `StoreError`, `IdempotencyConflict`, `QueueFull`,
                 `UnknownCursor`
- sqlite.py, sqlite_file.py, postgres.py   the two backends
- retry.py       riding out an outage of the store (the supervisor and the worker leaders)
"""

from server.store.connections import backend_for
from server.store.errors import (
    IdempotencyConflict,
    QueueFull,
    StoreBusy,
    StoreError,
    StoreFull,
    UnknownCursor,
)
from server.store.job import (
    ACTIVE,
    DENOISED,
    PHASE_PROGRESS,
    PHASE_TIMINGS,
    PHASES,
    STATUSES,
    TERMINAL,
    TIMED_PHASES,
    Job,
    lora_set,
)
from server.store.job_store import JobStore, open_store
from server.store.schema import SCHEMA_VERSION

__all__ = ["ACTIVE", "DENOISED", "PHASE_PROGRESS", "PHASE_TIMINGS", "PHASES", "SCHEMA_VERSION", "STATUSES",
           "TERMINAL", "TIMED_PHASES", "IdempotencyConflict", "Job", "JobStore", "QueueFull", "StoreBusy",
           "StoreError", "StoreFull", "UnknownCursor", "backend_for", "lora_set", "open_store"]  # fmt: skip
