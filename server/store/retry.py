"""Riding out a job-store outage: a PostgreSQL restart, connections cut, an SQLite lock held too long, a
full disk.

`StoreOutage` is one process side's view of its store (the supervisor's, a worker leader's): since when its
calls have failed with `StoreBusy` and why (None while the store answers), logged once when the store stops
answering and once when it answers again; /health and /ready read it. `PatientStore` wraps a `JobStore`: every
method is retried with capped backoff for up to `grace` seconds after its first failure, so an outage inside
the grace costs a wait, never a job; past it the call raises `StoreBusy` for its caller to handle. `.once`
makes single attempts that still keep the outage state (for writes whose newest value supersedes the last:
heartbeats, `LatestStep`'s progress). A write whose reply was lost may have committed: the retries of a claim
and of a job's end find what it did instead of doing it twice (`_AGAIN`).
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time

from server.store.errors import StoreBusy, StoreFull

log = logging.getLogger("ithaca.store")
FIRST_RETRY_S = 0.1
MAX_RETRY_S = 2.0  # a store that returns is noticed within this
# a full disk still answers reads: it is back once no write has failed for this long (a worker's heartbeat
# writes every second)
FULL_SETTLE_S = 3.0


class StoreOutage:
    def __init__(self, grace: float, who: str):
        self.grace, self.who = grace, who
        self.since: float | None = None  # time.time() of the first failure in a row
        self.reason: str | None = None
        self.back_at = -float("inf")  # time.monotonic() when the store last answered again after failing
        self.full_at = -float("inf")  # time.monotonic() of the last write a full disk refused
        self.gave_up = False  # a call failed past the grace in this outage: said once (each call's would be)
        self._lock = threading.Lock()

    def describe(self, *, detail: bool = True) -> str | None:
        """What /ready says while the store does not answer (None: it answers); without `detail` (for the
        unauthenticated /health) only whether it is locked, busy or unreachable, not the store's address."""
        since, reason = self.since, self.reason or ""
        if since is None:
            return None
        return f"{reason if detail else reason.split(' (')[0]} (for {time.time() - since:.0f} s)"

    def failed(self, error: StoreBusy) -> None:
        with self._lock:
            first = self.since is None
            if first:
                self.since = time.time()
            self.reason = str(error)
            if isinstance(error, StoreFull):
                self.full_at = time.monotonic()
        if first:
            log.warning("%s: %s (each call is retried for up to %g s)", self.who, error, self.grace)

    def answered(self) -> None:
        if self.since is None or time.monotonic() - self.full_at < FULL_SETTLE_S:
            return
        with self._lock:
            since, self.since, self.reason, self.gave_up = self.since, None, None, False
        if since is not None:
            self.back_at = time.monotonic()
            log.info("%s: the job store answers again, after %.1f s", self.who, time.time() - since)

    def attempt(self, fn, *args, **kwargs):
        """`fn(*args, **kwargs)` once; its outcome updates the state (StoreBusy is raised again)."""
        try:
            result = fn(*args, **kwargs)
        except StoreBusy as e:
            self.failed(e)
            raise
        self.answered()
        return result

    def call(self, fn, *args, again=None, grace: float | None = None, **kwargs):
        """`fn(*args, **kwargs)`, retried on StoreBusy with backoff (0.1 s doubling up to 2 s) until `grace`
        seconds (the outage's own unless given) after its first failure; then StoreBusy. `again`: what the
        retries call instead, for a write whose commit may have landed before its connection was lost (the
        retry must find it)."""
        grace = self.grace if grace is None else grace
        deadline, pause = None, FIRST_RETRY_S
        while True:
            try:
                return self.attempt(fn, *args, **kwargs)
            except StoreBusy as e:
                now = time.monotonic()
                deadline = deadline or now + grace
                if now >= deadline:
                    if not self.gave_up:
                        self.gave_up = True
                        log.error("%s: the job store did not answer for %g s: %s (calls fail until it does)",
                                  self.who, grace, e)  # fmt: skip
                    raise
                time.sleep(min(pause, deadline - now))
                pause = min(2 * pause, MAX_RETRY_S)
                fn = again or fn


def _claim_again(store, worker: str, instance: str, **preference):
    """A claim retried: the job it claimed if it did (the group would hold it forever, heartbeating), or a
    new claim."""
    mine = [job for job in store.in_progress(worker_prefix=worker) if job.worker == worker]
    return mine[0] if mine else store.claim(worker, instance, **preference)


def _finish_again(store, job_id: str, worker: str | None, status: str, **fields):
    """A job's end retried: the job as this worker ended it if it did (None would take a completed job's video
    away), or `finish` again."""
    job = store.get(job_id, include_deleted=True)
    mine = job is not None and job.worker == worker and fields.get("attempt") in (None, job.attempts)
    if worker is not None and mine and job.terminal:
        return job
    return store.finish(job_id, worker, status, **fields)


_AGAIN = {"claim": _claim_again, "finish": _finish_again}


class PatientStore:
    """A JobStore whose every method rides out an outage (`StoreOutage.call`); `raw` is the store itself."""

    def __init__(self, store, outage: StoreOutage, *, once: bool = False, grace: float | None = None):
        self.raw, self.outage, self._once, self._grace = store, outage, once, grace

    @functools.cached_property
    def once(self) -> PatientStore:
        """The same store making single attempts (the outage state still kept)."""
        return PatientStore(self.raw, self.outage, once=True)

    @functools.cached_property
    def until_answered(self) -> PatientStore:
        """The same store retrying each call for as long as the outage lasts, past the grace: for a job's
        end, once its video is made (its worker lives on, so nothing re-queues the job: given up, it stayed
        in progress until --job-timeout)."""
        return PatientStore(self.raw, self.outage, grace=math.inf)

    def __getattr__(self, name: str):
        method = getattr(self.raw, name)
        if not callable(method):
            return method
        if self._once:
            return functools.partial(self.outage.attempt, method)
        again = _AGAIN.get(name)
        again = again and functools.partial(again, self.raw)
        return functools.partial(self.outage.call, method, again=again, grace=self._grace)


class LatestStep:
    """A running job's progress as the leader records it, its steps and then its decoded latent frames, and
    its phase: written at once, or while the store does not answer kept (the newest of each) for `write` to
    put in once it does (the heartbeat thread calls it), so a step, a chunk of the decode or a phase change
    never waits on an outage, and one past the grace does not end a job that runs on."""

    def __init__(self, store: PatientStore, worker: str):
        self.store, self.worker = store, worker
        # (job, slot) → (store method, its arguments) not written yet, the newest of each: "phase"
        # ("set_phase", phase, timings), "step" ("progress", step, steps) or ("decoded", latent frames
        # decoded, of); a job's phase stays when the next job's comes (the MP4's "writing")
        self._pending: dict[tuple[str, str], tuple] = {}
        self._lock = threading.Lock()  # one write at a time, so an older step never lands last
        self._slots = threading.Lock()  # held only to put or take: a step never waits on a write
        self._stop: str | None = None  # a write found this job cancelled, or no longer this worker's

    def start(self, job_id: str) -> None:
        """A run of `job_id` begins: an earlier run's stop and unwritten progress are not its (a worker that
        stalled past the orphan timeout, its job queued again and claimed back, stopped the new run at its
        first step: "cancelled after step 1", the job lost)."""
        with self._slots:
            self._pending = {key: write for key, write in self._pending.items() if key[0] != job_id}
            if self._stop == job_id:
                self._stop = None

    def record(self, job_id: str, step: int, total: int) -> bool:
        """True: the job must stop (`JobStore.progress`), as far as the last write that landed knows."""
        return self._put(job_id, "step", ("progress", step, total))

    def decoded(self, job_id: str, frames: int, total: int) -> bool:
        """`record` for the decode (`JobStore.decoded`)."""
        return self._put(job_id, "step", ("decoded", frames, total))

    def phase(self, job_id: str, phase: str, timings: dict) -> bool:
        """`record` for a phase the job entered (`JobStore.set_phase`)."""
        return self._put(job_id, "phase", ("set_phase", phase, timings))

    def _put(self, job_id: str, slot: str, write: tuple) -> bool:
        with self._slots:
            self._pending[job_id, slot] = write
        if self.store.outage.since is None:
            self.write()
        return self._stop == job_id

    def write(self) -> None:
        with self._lock:
            with self._slots:
                pending, self._pending = self._pending, {}
            # the phases first: a job's decode progress counts from its phase's
            for key in sorted(pending, key=lambda key: key[1] != "phase"):
                (job_id, _), (method, *args) = key, pending[key]
                try:
                    if getattr(self.store.once, method)(job_id, self.worker, *args):
                        self._stop = job_id
                except StoreBusy:  # kept, unless a newer one came meanwhile
                    with self._slots:
                        self._pending = pending | self._pending
                    return
                del pending[key]
