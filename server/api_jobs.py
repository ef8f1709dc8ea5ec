"""The native jobs API: /generate, /jobs, /jobs/{id}, /jobs/{id}/events (SSE), /jobs/{id}/video."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from server.services import Services
from server.store import Job

router = APIRouter()
SSE_POLL_S = 0.1
_BIG = 1_000_000


class GenerateBody(BaseModel):
    """Unknown fields are refused; ranges beyond these sanity bounds come from the loaded model's limits."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str = Field(min_length=1, max_length=20_000)
    negative_prompt: str = Field("", max_length=20_000)
    num_frames: int | None = Field(None, ge=1, le=_BIG)
    height: int | None = Field(None, ge=1, le=_BIG)
    width: int | None = Field(None, ge=1, le=_BIG)
    num_inference_steps: int | None = Field(None, ge=1, le=10_000)
    guidance_scale: float | None = Field(None, ge=0.0, le=1000.0, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    fps: int | None = Field(None, ge=1, le=1000)


def svc(request: Request) -> Services:
    return request.app.state.services


def job_view(services: Services, job: Job) -> dict:
    return {
        "id": job.id,
        "status": job.status,
        "progress": job.progress,
        "step": job.step,
        "total_steps": job.total_steps,
        "queue_position": services.store.queue_position(job),
        "request": job.spec,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "timings": job.timings,
        "attempts": job.attempts,
        "worker": job.worker,
        "cancel_requested": job.cancel_requested,
        "error": job.error,
        "video_url": f"/jobs/{job.id}/video" if job.status == "completed" else None,
    }


@router.post("/generate", status_code=202)
async def generate(
    request: Request, body: GenerateBody, idempotency_key: Annotated[str | None, Header()] = None
):
    services = svc(request)
    job, created = services.submit(body.model_dump(exclude_none=True), idempotency_key=idempotency_key)
    view = job_view(services, job)
    return JSONResponse(view, status_code=202, headers={} if created else {"Idempotent-Replayed": "true"})


@router.get("/jobs")
async def list_jobs(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
    order: Literal["asc", "desc"] = "desc",
    status: Literal["queued", "in_progress", "completed", "failed", "cancelled"] | None = None,
):
    services = svc(request)
    jobs, has_more = services.store.list(limit=limit, after=after, order=order, status=status)
    return {
        "data": [job_view(services, j) for j in jobs],
        "has_more": has_more,
        "last_id": jobs[-1].id if jobs else None,
    }


@router.get("/jobs/{job_id}")
async def get_job(request: Request, job_id: str):
    services = svc(request)
    return JSONResponse(job_view(services, services.job(job_id)))  # the hot poll path: skip jsonable_encoder


@router.delete("/jobs/{job_id}")
async def cancel_job(request: Request, job_id: str):
    services = svc(request)
    return job_view(services, services.cancel(job_id))


def video_file(request: Request, job_id: str) -> FileResponse:
    """The finished MP4 of a job (404 until completed); both APIs serve it this way."""
    services = svc(request)
    job = services.job(job_id)
    return FileResponse(services.video_path(job), media_type="video/mp4", filename=f"{job.id}.mp4")


@router.get("/jobs/{job_id}/video")
async def get_video(request: Request, job_id: str):
    return video_file(request, job_id)


@router.get("/jobs/{job_id}/events")
async def job_events(request: Request, job_id: str):
    """Server-Sent Events: a `progress` event whenever the job changes, then one final `done` event."""
    services = svc(request)
    services.job(job_id)  # 404 before the stream starts

    async def stream():
        last = None
        while (job := services.store.get(job_id)) is not None:  # None: deleted meanwhile (/v1/videos)
            view = job_view(services, job)
            terminal = view["status"] in ("completed", "failed", "cancelled")
            key = (view["status"], view["step"], view["queue_position"])
            if key != last:
                last = key
                yield f"event: {'done' if terminal else 'progress'}\ndata: {json.dumps(view)}\n\n"
            if terminal or await request.is_disconnected():
                return
            await asyncio.sleep(SSE_POLL_S)

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
