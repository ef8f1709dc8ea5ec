"""The durable job store (server/store/job_store.py); its names as the rest of the server imports them."""

from server.store.job_store import (
    ACTIVE,
    DENOISED,
    PHASE_PROGRESS,
    PHASE_TIMINGS,
    PHASES,
    SCHEMA_VERSION,
    STATUSES,
    TERMINAL,
    TIMED_PHASES,
    IdempotencyConflict,
    Job,
    JobStore,
    QueueFull,
    backend_for,
    open_store,
)
from server.store.sqlite_file import StoreBusy, StoreError

__all__ = ["ACTIVE", "DENOISED", "PHASE_PROGRESS", "PHASE_TIMINGS", "PHASES", "SCHEMA_VERSION", "STATUSES",
           "TERMINAL", "TIMED_PHASES", "IdempotencyConflict", "Job", "JobStore", "QueueFull", "StoreBusy",
           "StoreError", "backend_for", "open_store"]  # fmt: skip
