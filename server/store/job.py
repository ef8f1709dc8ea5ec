"""A job as the store keeps it: its states and phases, the `Job` read from a row, and the one log line each
change of state writes."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger("ithaca.jobs")

ACTIVE = ("queued", "in_progress")
TERMINAL = ("completed", "failed", "cancelled")
OUR_COLUMNS = {"id", "status", "spec", "created_at"}  # a `jobs` table without these is not ours
STATUSES = ACTIVE + TERMINAL
PHASES = ("queued", "encoding", "denoising", "decoding", "writing")
TIMED_PHASES = PHASES[1:]
# The seconds of each phase: a column each, so a running job shows the phases it has finished and a failed
# one keeps them (the rest of a job's timings is one JSON object written with its terminal state).
PHASE_TIMINGS = tuple(f"{phase}_s" for phase in TIMED_PHASES)
# Progress (0-100) at the start of each phase: denoising steps fill 0..DENOISED, the decode and the MP4
# the rest, so a long decode is not "99 %" for seconds; 100 is reached only on completion.
DENOISED = 90
PHASE_PROGRESS = {"decoding": DENOISED, "writing": 97}


@dataclass
class Job:
    seq: int
    id: str
    status: str
    spec: dict
    meta: dict
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    step: int = 0
    total_steps: int = 0
    progress: int = 0
    attempts: int = 0
    cancel_requested: bool = False
    deleted: bool = False
    worker: str | None = None
    instance: str | None = None  # the server whose worker group claimed it last (wrote its video)
    video: str | None = None
    timings: dict = field(default_factory=dict)
    error: str | None = None
    phase: str = "queued"
    preview_step: int | None = None
    resumed_from_step: int | None = None
    batch: int | None = None  # how many jobs shared its run's forwards (1: alone); None until claimed

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def timings_until(self, now: float) -> dict:
        """The timings of a run ended from outside (its time limit), as far as the store tells them: the run's
        seconds from its claim to `now`, its steps, and the seconds not in the phases it finished counted to
        the phase it was in. How long each step took only the worker knew (`mean_step_s` null)."""
        total = now - self.started_at
        finished = sum(self.timings.get(name) or 0.0 for name in PHASE_TIMINGS)
        out = {"total_s": total, "steps": self.step - (self.resumed_from_step or 0), "mean_step_s": None}
        if f"{self.phase}_s" in PHASE_TIMINGS:
            out[f"{self.phase}_s"] = max(total - finished, 0.0)
        return out


def lora_set(loras) -> str:
    """A request's LoRA set as the store compares it (the `lora_set` column): its (name, strength) pairs in
    name order; "" for none."""
    return json.dumps(sorted([str(name), float(strength)] for name, strength in loras)) if loras else ""


def job_from_row(row) -> Job | None:
    if row is None:
        return None
    return Job(
        seq=row["seq"],
        id=row["id"],
        status=row["status"],
        spec=json.loads(row["spec"]),
        meta=json.loads(row["meta"]),
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        step=row["step"],
        total_steps=row["total_steps"],
        progress=row["progress"],
        attempts=row["attempts"],
        cancel_requested=bool(row["cancel_requested"]),
        deleted=bool(row["deleted"]),
        worker=row["worker"],
        instance=row["instance"],
        video=row["video"],
        # null for the phases not reached; a job finished by an earlier version has them in its JSON
        timings={c: row[c] for c in PHASE_TIMINGS} | json.loads(row["timings"] or "{}"),
        error=row["error"],
        phase=row["phase"],
        preview_step=row["preview_step"],
        resumed_from_step=row["resumed_from_step"],
        batch=row["batch"],
    )


def log_change(job: Job | None, reason: str | None = None) -> Job | None:
    """One log line per job state change: id, state, phase, seconds since it was claimed (or created)."""
    if job is not None:
        since = job.started_at if job.started_at is not None else job.created_at
        fields = {
            "job": job.id,
            "state": job.status,
            "phase": job.phase,
            "duration_s": round(time.time() - since, 3),
        }
        if job.terminal and job.error:
            fields["error"] = job.error
        if reason:
            fields["reason"] = reason
        # text: the phase where it says more than the state, and why (a re-queue's reason, a failure's
        # error): it read "queued (queued)", the reason in the JSON record alone
        phase = f" ({job.phase})" if job.phase != job.status else ""
        why = fields.get("error") or reason
        log.info(
            "job %s %s%s %.1f s%s",
            job.id,
            job.status,
            phase,
            fields["duration_s"],
            f": {why}" if why else "",
            extra={"fields": fields},
        )
    return job
