"""The JSON replies of both APIs as the OpenAPI document describes them. Documentation only: the routes
build their replies as plain dicts (`job_view`, `video_view`) and send them as they are; the tests hold every
reply to these schemas (tests/test_server_openapi.py), and no field is sent without one (`extra="forbid"`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from server.store.job import PHASES, STATUSES

Status = Literal[STATUSES]  # queued | in_progress | completed | failed | cancelled


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Timings(BaseModel):
    """Seconds of each phase (null until it is over), and with the terminal state the run's totals."""

    model_config = ConfigDict(extra="forbid")
    encoding_s: float | None
    denoising_s: float | None
    decoding_s: float | None
    writing_s: float | None
    total_s: float | None = Field(None, description="the run's seconds from its claim")
    steps: int | None = Field(
        None, description="the steps this run took (a resumed run: after its checkpoint)"
    )
    mean_step_s: float | None = None
    evaluated: int | None = Field(None, description="transformer passes run in full (a completed job)")
    skipped: int | None = Field(None, description="transformer passes the step cache skipped")


class JobView(_Reply):
    id: str
    status: Status
    phase: Literal[PHASES]
    progress: int = Field(ge=0, le=100, description="steps fill 0-90, the decode 90-97, writing 97, done 100")
    step: int = Field(ge=0)
    total_steps: int = Field(ge=0, description="0 until a worker has first validated the request")
    queue_position: int | None = Field(description="jobs queued before it (0: next); null unless queued")
    request: dict[str, Any] = Field(description="the request, with the model's defaults once claimed")
    created_at: float
    started_at: float | None
    finished_at: float | None
    expires_at: int | None = Field(description="when --keep-hours deletes the job; null: kept")
    timings: Timings
    attempts: int
    resumed_from_step: int | None
    batch: int | None = Field(description="how many jobs shared its run's forwards; null until claimed")
    worker: str | None
    cancel_requested: bool
    error: str | None
    warnings: list[str]
    video_url: str | None
    preview_step: int | None
    preview_url: str | None


class Links(_Reply):
    video_url: str | None = Field(description="null until the job is completed")
    preview_url: str | None = Field(description="null until a live preview is in place")
    expires_at: int | None = Field(description="when the links stop opening; null: no key is set")


class JobList(_Reply):
    data: list[JobView]
    has_more: bool
    last_id: str | None = Field(description="give it as `after` for the next page")


class VideoError(_Reply):
    code: Literal["cancelled", "generation_failed"]
    message: str


class Video(_Reply):
    """OpenAI's Video object, and the job's `warnings` and `seed` (the SDK keeps extra fields)."""

    id: str
    object: Literal["video"]
    model: str
    status: Literal["queued", "in_progress", "completed", "failed"]
    progress: int = Field(ge=0, le=100)
    created_at: int
    completed_at: int | None
    expires_at: int | None
    prompt: str | None
    size: str = Field(description='WIDTHxHEIGHT; "" until a worker has published the model\'s limits')
    seconds: str
    error: VideoError | None
    warnings: list[str]
    seed: int | None


class VideoList(_Reply):
    object: Literal["list"]
    data: list[Video]
    has_more: bool
    first_id: str | None
    last_id: str | None


class VideoDeleted(_Reply):
    id: str
    object: Literal["video.deleted"]
    deleted: Literal[True]


class Health(_Reply):
    status: Literal["ok", "degraded"]
    reason: str | None = Field(None, description="why the server cannot do its work now (degraded only)")


class Ready(_Reply):
    ready: bool
    group: str | None
    restarts: int
    fatal: str | None
    reason: str | None
    comm: Any = Field(description="the exchange the workers use, and with --comm auto the probe's rows")
    warmup: Any = Field(description="the sizes --warmup generated, each with its seconds")


def reply(model: type[BaseModel], status: int = 200, description: str = "Successful Response") -> dict:
    """A route's `responses` entry for its JSON reply."""
    return {status: {"model": model, "description": description}}
