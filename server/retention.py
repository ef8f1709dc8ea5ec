"""Finished jobs kept for `--keep-hours`, then deleted as `DELETE /v1/videos/ID` deletes them (the job gone
for every reader, its MP4, preview and input image removed), so a server that serves a crowd does not fill
its disk with videos nobody fetches. Every server sharing a job store runs it: the store hides a job once,
and each server removes what its own results folder holds."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from fastapi import HTTPException

from server.store import StoreBusy

log = logging.getLogger("ithaca.server")
SWEEP_S = 60.0  # a job outlives its hours by at most this
BATCH = 500  # jobs read at a time


class Retention:
    def __init__(self, services, keep_hours: float):
        self.services, self.keep_s = services, keep_hours * 3600
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="retention", daemon=True)

    def sweep(self, now: float) -> int:
        """Delete every job that finished more than --keep-hours before `now`; how many went."""
        deleted = 0
        while True:
            jobs = self.services.store.expired(now - self.keep_s, BATCH)
            for job in jobs:
                with contextlib.suppress(HTTPException):  # a client deleted it meanwhile
                    self.services.cancel(job.id, delete=True)
            deleted += len(jobs)
            if len(jobs) < BATCH:
                break
        if deleted:
            log.info("deleted %d jobs finished over %g h ago (--keep-hours)", deleted, self.keep_s / 3600)
        return deleted

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(SWEEP_S):
            try:
                self.sweep(time.time())
            except StoreBusy:
                pass  # an outage: the next sweep deletes them
            except Exception:
                log.exception("retention: a sweep failed; trying again in %g s", SWEEP_S)
