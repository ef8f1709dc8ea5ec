"""What the job store raises for its callers to handle: the store does not answer in time (`StoreBusy`), is
not a usable job store (`StoreError`), refuses a new job (`IdempotencyConflict`, `QueueFull`) or a list's
cursor (`UnknownCursor`)."""

from __future__ import annotations

_FIX = "move it aside (or restore a backup) and start again; a new, empty store is created in its place"


class StoreBusy(RuntimeError):
    """The store did not answer in time: "locked" (another process held SQLite's write lock past the busy
    timeout), "busy" (a PostgreSQL lock wait or deadlock), "unreachable" (no connection to PostgreSQL) or
    "full" (its disk: nothing can be written until space is freed), as its message says; the API answers 503
    with it, the supervisor and the workers retry (server/store/retry.py)."""


class StoreFull(StoreBusy):
    """The store's disk is full: an outage like the others (the writes go on once space is freed), said so
    instead of a 500 and a worker group that looks as if it were still loading. Reads still answer."""


def disk_full(detail: str) -> StoreFull:
    return StoreFull(f"the job store's disk is full ({detail}); free space there and the store carries on")


class StoreError(RuntimeError):
    """The store at `path` (a file, or a database URL) is not a usable job store; the message says what to
    do (`fix`; by default: move the file aside)."""

    def __init__(self, path: str, problem: str, *, fix: str = _FIX):
        super().__init__(f"job store {path}: {problem}; {fix}")
        self.problem = problem  # without the fix: a running server's outage needs no start-up advice


class IdempotencyConflict(ValueError):
    """An idempotency key came back with a different request; `args[0]` is the id of the key's job."""


class UnknownCursor(LookupError):
    """A list's `after` names no job this store ever held (a deleted one's still counts: a page read after it
    goes on from where it was)."""


class QueueFull(Exception):
    """`create` found `max_queued` jobs waiting already; `queued`: how many."""

    def __init__(self, queued: int):
        super().__init__(f"{queued} jobs are queued")
        self.queued = queued
