"""OpenAI-compatible videos API under /v1/videos, shaped after the official SDK (`openai.types.video.Video`).

`client.videos.create` sends multipart form fields (prompt, model, seconds, size); JSON works too. `size`
"WxH" is used as given when the loaded model allows it, otherwise its aspect ratio is fitted to the
model's default pixel count (rounded to the allowed multiples); `seconds` becomes the nearest valid frame
count at the model's fps. The reply reports the size and seconds actually generated. A cancelled job shows
as `failed` with code "cancelled".
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from fastapi import APIRouter, Header, HTTPException, Query, Request
from starlette.datastructures import UploadFile

from server.api_jobs import svc, video_file
from server.services import Services, unprocessable
from server.store import Job

router = APIRouter(prefix="/v1/videos")
_FIELDS = {"prompt", "model", "seconds", "size"}
_SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")


def _snap(value: float, spec: dict) -> int:
    """Nearest value allowed by a published range {min, max, multiple_of}."""
    lo, hi, mult = spec.get("min", 1), spec.get("max"), spec.get("multiple_of") or 1
    snapped = lo + max(0, round((value - lo) / mult)) * mult
    if hi is not None and snapped > hi:
        snapped = lo + int((hi - lo) // mult) * mult
    return int(snapped)


def _fits(value: int, spec: dict) -> bool:
    return _snap(value, spec) == value


def map_request(fields: dict, info: dict) -> dict:
    """OpenAI create fields → our generation request."""
    limits, defaults = info.get("limits", {}), info.get("defaults", {})
    prompt = fields.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise unprocessable("prompt", "prompt is required and must be a non-empty string")
    spec: dict = {"prompt": prompt}
    if fields.get("seconds") is not None:
        try:
            seconds = float(fields["seconds"])
        except (TypeError, ValueError):
            seconds = math.nan
        if not 0 < seconds <= 3600:
            raise unprocessable("seconds", f"seconds={fields['seconds']!r} must be a number in (0, 3600]")
        fps = defaults.get("fps") or 16
        spec["num_frames"] = _snap(seconds * fps, limits.get("num_frames", {}))
    if fields.get("size") is not None:
        match = _SIZE.match(str(fields["size"]))
        if not match or 0 in (int(match[1]), int(match[2])):
            raise unprocessable("size", f"size={fields['size']!r} must be WIDTHxHEIGHT, e.g. 832x480")
        w, h = int(match[1]), int(match[2])
        lw, lh = limits.get("width", {}), limits.get("height", {})
        if not (_fits(w, lw) and _fits(h, lh)) and defaults.get("width") and defaults.get("height"):
            scale = math.sqrt(defaults["width"] * defaults["height"] / (w * h))
            w, h = _snap(w * scale, lw), _snap(h * scale, lh)
        spec |= {"width": w, "height": h}
    return spec


def video_view(services: Services, job: Job) -> dict:
    defaults = services.worker_info().get("defaults", {})
    value = lambda name: job.spec.get(name, defaults.get(name))  # noqa: E731
    frames, fps = value("num_frames"), value("fps") or 16
    failed = job.status in ("failed", "cancelled")
    return {
        "id": job.id,
        "object": "video",
        "model": job.meta.get("model") or services.config.model,
        "status": "failed" if failed else job.status,
        "progress": job.progress,
        "created_at": int(job.created_at),
        "completed_at": int(job.finished_at) if job.status == "completed" else None,
        "expires_at": None,
        "prompt": job.spec.get("prompt"),
        "size": f"{value('width')}x{value('height')}",
        "seconds": f"{frames / fps:g}" if frames else "",
        "error": {
            "code": "cancelled" if job.status == "cancelled" else "generation_failed",
            "message": job.error or job.status,
        }
        if failed
        else None,
    }


async def _create_fields(request: Request) -> dict:
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data") or content_type.startswith("application/x-www-form"):
        form = await request.form()
        fields = {}
        for key, item in form.multi_items():
            if isinstance(item, UploadFile):
                raise unprocessable(key, f"{key}: file inputs (input_reference) are not supported")
            fields[key] = item
    else:
        try:
            fields = await request.json()
        except ValueError:
            raise HTTPException(400, "body must be JSON or multipart/form-data") from None
        if not isinstance(fields, dict):
            raise HTTPException(422, "body must be a JSON object")
    for key in fields:
        if key not in _FIELDS:
            raise unprocessable(key, f"unknown field {key!r}; allowed: {sorted(_FIELDS)}")
    return fields


@router.post("")
async def create_video(request: Request, idempotency_key: Annotated[str | None, Header()] = None):
    services = svc(request)
    fields = await _create_fields(request)
    if fields.get("model") is not None and not isinstance(fields["model"], str):
        raise unprocessable("model", "model must be a string")
    spec = map_request(fields, services.worker_info())
    job, _ = services.submit(spec, meta={"model": fields.get("model")}, idempotency_key=idempotency_key)
    return video_view(services, job)


@router.get("")
async def list_videos(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
    order: Literal["asc", "desc"] = "desc",
):
    services = svc(request)
    jobs, has_more = services.store.list(limit=limit, after=after, order=order)
    data = [video_view(services, j) for j in jobs]
    return {
        "object": "list",
        "data": data,
        "has_more": has_more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


@router.get("/{video_id}")
async def retrieve_video(request: Request, video_id: str):
    services = svc(request)
    return video_view(services, services.job(video_id))


@router.delete("/{video_id}")
async def delete_video(request: Request, video_id: str):
    """Cancels the job if it is still queued or running, hides it and removes its video."""
    services = svc(request)
    job = services.cancel(video_id, delete=True)
    return {"id": job.id, "object": "video.deleted", "deleted": True}


@router.get("/{video_id}/content")
async def video_content(request: Request, video_id: str, variant: Literal["video"] = "video"):
    return video_file(request, video_id)
