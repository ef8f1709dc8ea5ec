"""Running jobs whose worker stopped answering (no heartbeat for `--orphan-timeout`), whichever server claimed
them: re-queued, or failed past their attempts, by every server sharing the store. A supervisor sweeps in its
rounds; an API-only server (`--no-workers`) in a thread of its own (`Sweeper`), so a queue whose worker boxes
all vanished does not show their jobs running forever."""

from __future__ import annotations

import logging
import time

from server import videos
from server.config import ServeConfig
from server.periodic import Periodic
from server.store import JobStore
from server.store.retry import PatientStore, StoreOutage

log = logging.getLogger("ithaca.supervisor")
SWEEP_S = 5.0


def requeue(config: ServeConfig, store, job, reason: str, counted: bool = True, gone: bool = False) -> None:
    """Re-queue an interrupted job, or fail it past its attempts: then its checkpoint goes too.
    `counted=False`: the run ended for no fault of the job's (a shutdown), and does not use an attempt.
    `gone`: the run's group is gone, so the MP4 it was writing goes now, not at the next start's sweep (an
    orphan's run may live on, stalled, and still write it)."""
    after = store.requeue_or_fail(job, max_attempts=config.max_attempts, reason=reason, counted=counted)
    if gone:
        videos.remove_partial(config.videos_dir, job.id, job.attempts)
    if after is not None and after.terminal:
        videos.remove_checkpoint(config.videos_dir, job.id)


class OrphanSweep:
    """Called as often as the caller likes; sweeps at most every `SWEEP_S` seconds."""

    def __init__(self, config: ServeConfig, store: PatientStore, outage: StoreOutage):
        self.config, self.store, self.outage = config, store, outage
        self._last = -float("inf")

    def __call__(self) -> None:
        now, stale = time.monotonic(), self.config.orphan_timeout
        if now - self._last < SWEEP_S:
            return
        self._last = now
        if now - self.outage.back_at < stale:
            # after an outage, the workers get `stale` seconds to write their buffered heartbeats; a write
            # still tells of the store failing again (the sweep was an idle server's only write: a second
            # lock went unseen, /health "ok", /ready blaming the workers' disk)
            self.store.write_probe()
            return
        self.store.prune_workers(stale_after=stale)
        for job in self.store.orphans(stale_after=stale):
            log.warning(
                "job %s: its worker %s sent no heartbeat for %g s; re-queueing", job.id, job.worker, stale
            )
            requeue(self.config, self.store, job, f"its worker {job.worker} stopped answering (no heartbeat "
                    f"for {stale:g} s)")  # fmt: skip


class Sweeper(Periodic):
    """An API-only server's sweep, in a thread of its own; store outages are ridden out as a supervisor's
    are (`PatientStore`)."""

    name, every = "orphan sweep", SWEEP_S

    def __init__(self, config: ServeConfig, store: JobStore):
        super().__init__()
        outage = StoreOutage(config.store_outage_grace, "orphan sweep")
        self.sweep = OrphanSweep(config, PatientStore(store, outage), outage)

    def tick(self) -> None:
        self.sweep()
