"""Finished jobs kept for `--keep-hours`, then deleted as `DELETE /v1/videos/ID` deletes them (the job gone
for every reader, its MP4, preview and input image removed), so a server that serves a crowd does not fill
its disk with videos nobody fetches. Every server sharing a job store runs it: the store hides a job once,
and each server removes what its own results folder holds."""

from __future__ import annotations

import contextlib
import logging
import time

from fastapi import HTTPException

from server.periodic import Periodic

log = logging.getLogger("ithaca.server")
SWEEP_S = 60.0  # a job outlives its hours by at most this
BATCH = 500  # jobs read at a time


class Retention(Periodic):
    name, every = "retention", SWEEP_S

    def __init__(self, services, keep_hours: float):
        super().__init__()
        self.services, self.keep_s = services, keep_hours * 3600

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
            said = f"{deleted} job{'' if deleted == 1 else 's'}"
            log.info("deleted %s finished over %g h ago (--keep-hours)", said, self.keep_s / 3600)
        return deleted

    def tick(self) -> None:
        self.sweep(time.time())
