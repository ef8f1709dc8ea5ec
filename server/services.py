"""What the routes share: settings, the job store, the supervisor (None when attached), and the job rules
both APIs apply (id checks, published limits, the queue cap, cancel, the video path)."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field

from fastapi import HTTPException

from server import limits as limits_mod
from server.config import ServeConfig
from server.store import Job, JobStore
from server.supervisor import Supervisor, group_ready

_ID = re.compile(r"^[0-9a-f]{32}$")
LIMITS_CACHE_S = 1.0


def unprocessable(field_name: str, message: str) -> HTTPException:
    """422 in FastAPI's own validation-error shape, naming the field."""
    return HTTPException(422, [_error(field_name, message)])


def _error(field_name: str, message: str) -> dict:
    return {"loc": ["body", field_name], "msg": message, "type": "value_error"}


@dataclass
class Services:
    config: ServeConfig
    store: JobStore
    supervisor: Supervisor | None
    _worker_info: tuple[float, dict] = field(default=(0.0, {}))

    def worker_info(self) -> dict:
        """Limits and request defaults the newest worker published (cached for a second)."""
        at, info = self._worker_info
        if time.monotonic() - at > LIMITS_CACHE_S:
            workers = self.store.workers()
            info = workers[0]["info"] if workers else {}
            self._worker_info = (time.monotonic(), info)
        return info

    def ready(self) -> bool:
        return self.supervisor.ready() if self.supervisor is not None else group_ready(self.store)

    def job(self, job_id: str) -> Job:
        job = self.store.get(job_id) if _ID.match(job_id) else None
        if job is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return job

    def submit(
        self, spec: dict, *, meta: dict | None = None, idempotency_key: str | None
    ) -> tuple[Job, bool]:
        errors = limits_mod.check(spec, self.worker_info().get("limits", {}))
        if errors:
            raise HTTPException(422, [_error(f, m) for f, m in errors])
        if idempotency_key is not None and len(idempotency_key) > 255:
            raise HTTPException(400, "Idempotency-Key is longer than 255 characters")
        queued = self.store.queued_count()
        if queued >= self.config.max_queue:
            raise HTTPException(
                429,
                f"the queue is full ({queued} jobs waiting); retry later",
                headers={"Retry-After": str(self.retry_after(queued))},
            )
        return self.store.create(spec, meta=meta, idempotency_key=idempotency_key)

    def retry_after(self, queued: int) -> int:
        """Seconds until the queue has room, from the mean job duration so far (1 s when unknown)."""
        counters = self.store.counters()
        count = counters.get("ithaca_job_duration_seconds_count", 0)
        mean = counters.get("ithaca_job_duration_seconds_sum", 0.0) / count if count else 1.0
        return max(1, min(3600, round(mean * max(1, queued - self.config.max_queue + 1))))

    def cancel(self, job_id: str, *, delete: bool = False) -> Job:
        job = self.job(job_id)
        if job.status in ("completed", "failed") and not delete:
            raise HTTPException(409, f"job {job_id} already {job.status}")
        job = self.store.cancel(job.id, delete=delete)
        if delete and job.video:
            path = self.video_path(job)
            if os.path.exists(path):
                os.remove(path)
        return job

    def video_path(self, job: Job) -> str:
        """The job's MP4 inside the results folder (never anywhere else)."""
        root = self.config.videos_dir
        path = os.path.realpath(os.path.join(root, os.path.basename(job.video or "")))
        if job.status != "completed" or not job.video or os.path.dirname(path) != os.path.realpath(root):
            raise HTTPException(404, f"job {job.id} has no video (status {job.status})")
        if not os.path.isfile(path):
            raise HTTPException(404, f"the video of job {job.id} is gone")
        return path
