"""OpenAI-compatible videos API under /v1/videos, shaped after the official SDK (`openai.types.video.Video`).

`client.videos.create` sends multipart form fields (prompt, model, seconds, size); JSON works too. A `size`
"WxH" or `seconds` outside the loaded model's limits is a 422 naming the field and the allowed range; inside
them, width and height become the nearest allowed multiples and `seconds` the nearest valid frame count at
the model's fps. The reply reports the size and seconds actually generated. A cancelled job shows
as `failed` with code "cancelled". `/content?variant=thumbnail` is the job's latest live preview (WebP).
`input_reference`, the first frame of an image-to-video model, is a file
part (what the SDK sends) or a data URL, checked as /generate checks `image`. `loras` (the SDK's
`extra_body={"loras": [...]}`) are /generate's (server/loras.py).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from dit.request import MAX_SEED
from server import limits as limits_mod
from server import loras as loras_mod
from server.api_jobs import (
    MULTIPART,
    PREVIEW,
    PROMPT_PATTERN,
    TEXT_PATTERN,
    URLENCODED,
    VIDEO,
    IdempotencyKey,
    form_fields,
    integral,
    json_fields,
    media_type,
    preview_file,
    submitted,
    svc,
    video_file,
)
from server.file_response import PARTS
from server.jsonsafe import shown
from server.number_patterns import decimal_range
from server.openai_errors import responses
from server.replies import Video, VideoDeleted, VideoList, reply
from server.services import MAX_PROMPT_CHARS, Services, text_field, unprocessable
from server.store import Job

router = APIRouter(prefix="/v1/videos")
_IMAGE = "input_reference"
_FIELDS = {"prompt", "model", "seconds", "size", "seed", _IMAGE, loras_mod.FIELD}
# ASCII digits only, the whole string (`\d` takes any script's digits; `$` lets a final newline through).
_SIZE = re.compile(r"([0-9]{1,5})x([0-9]{1,5})")
_SECONDS = re.compile(r"[0-9]{1,4}(\.[0-9]{1,6})?")
_SEED = re.compile(r"[0-9]{1,19}")  # not OpenAI's: the SDK sends it with extra_body={"seed": 7}
# The document's `seconds`: what `_seconds` takes, (0, 3600] (not 0, below 3600 or 3600 itself)
_SECONDS_RULE = r"^(?!0+(\.0+)?$)(([0-9]{1,3}|[0-2][0-9]{3}|3[0-5][0-9]{2})(\.[0-9]{1,6})?|3600(\.0{1,6})?)$"
MAX_MODEL_CHARS = 256
_FORMS = (MULTIPART, URLENCODED)
_FORM_SCHEMA = {
    "type": "object",
    "required": ["prompt"],
    "properties": {
        "prompt": {"type": "string", "maxLength": MAX_PROMPT_CHARS, "pattern": PROMPT_PATTERN},
        "model": {"type": "string", "maxLength": MAX_MODEL_CHARS, "pattern": TEXT_PATTERN},
        "seconds": {"type": "string", "pattern": _SECONDS_RULE},
        "size": {"type": "string", "pattern": f"^(?!0+x)(?!.*x0+$){_SIZE.pattern}$"},  # no side of 0
        "seed": {
            "type": "string",
            "pattern": f"^{decimal_range(Fraction(0), Fraction(MAX_SEED), 19)}$",
            "description": "the initial noise's seed (not in OpenAI's API; left out: a random one)",
        },
        _IMAGE: {"type": "string", "format": "binary", "description": "PNG, JPEG or WebP; or a data URL"},
    },
    "additionalProperties": False,
}
_LORAS = {
    "type": "array",
    "items": {"$ref": "#/components/schemas/LoraItem"},
    "maxItems": loras_mod.MAX_LORAS,
    "description": loras_mod.DESCRIPTION,
}
# `loras` in multipart: JSON parts (a urlencoded form takes them too, but no schema can say so)
_MULTIPART_SCHEMA = _FORM_SCHEMA | {
    "properties": _FORM_SCHEMA["properties"]
    | {
        loras_mod.FIELD: _LORAS
        | {
            "description": f"{loras_mod.DESCRIPTION}: JSON, a part per LoRA or one array (the SDK's "
            "extra_body sends loras[][name] and loras[][strength] fields, also taken)"
        }
    }
}
_JSON_SCHEMA = _FORM_SCHEMA | {
    "properties": _FORM_SCHEMA["properties"]
    | {
        "seconds": {
            "anyOf": [
                _FORM_SCHEMA["properties"]["seconds"],
                {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
            ]
        },
        "seed": {
            "anyOf": [
                _FORM_SCHEMA["properties"]["seed"],
                {"type": "integer", "minimum": 0, "maximum": MAX_SEED},
            ]
        },
        _IMAGE: {"type": "string", "description": "a data URL: data:image/png;base64,..."},
        loras_mod.FIELD: _LORAS,
    }
}
_CREATE_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": _JSON_SCHEMA},
        "multipart/form-data": {
            "schema": _MULTIPART_SCHEMA,
            "encoding": {loras_mod.FIELD: {"contentType": "application/json"}},
        },
        "application/x-www-form-urlencoded": {"schema": _FORM_SCHEMA},
    },
}


def schema_with_limits(document: dict, info: dict) -> dict:
    """The OpenAPI document (a copy: api_jobs.schema_with_limits) with the `seconds` and `size` the loaded
    model takes (`info`: what the workers published), `loras` of its catalogue's names, and without
    `input_reference` when it is text-to-video and refuses one."""
    limits, defaults = info.get("limits", {}), info.get("defaults", {})
    frames, width, height = (limits.get(name, {}) for name in ("num_frames", "width", "height"))
    published = "limits" in info
    names = loras_mod.describe(document["components"]["schemas"]["LoraItem"], info.get(loras_mod.FIELD))
    for media in document["paths"]["/v1/videos"]["post"]["requestBody"]["content"].values():
        media["schema"] = dict(media["schema"])
        fields = media["schema"]["properties"] = dict(media["schema"]["properties"])
        if published and loras_mod.FIELD in fields and names is None:  # a request can name none
            del fields[loras_mod.FIELD]
        elif published and loras_mod.FIELD in fields:
            fields[loras_mod.FIELD] = names | {"description": fields[loras_mod.FIELD]["description"]}
        if "max" in frames:
            fps = _fps(defaults)
            lo, hi = Fraction(frames.get("min", 1), fps), Fraction(frames["max"], fps)
            text = {"type": "string", "pattern": f"^{decimal_range(lo, hi, 4, 6)}$"}
            number = {"type": "number", "minimum": float(lo), "maximum": float(hi)}
            fields["seconds"] = {"anyOf": [text, number]} if "anyOf" in fields["seconds"] else text
        if "max" in width and "max" in height:
            sides = (decimal_range(Fraction(s.get("min", 1)), Fraction(s["max"]), 5) for s in (width, height))
            fields["size"] = {"type": "string", "pattern": "^{}x{}$".format(*sides)}
    if "image" in limits and not limits_mod.accepts_image(limits["image"]):
        for media in document["paths"]["/v1/videos"]["post"]["requestBody"]["content"].values():
            media["schema"] = media["schema"] | {
                "properties": {k: v for k, v in media["schema"]["properties"].items() if k != _IMAGE}
            }
    return document


def _snap(value: float, spec: dict) -> int:
    """The allowed value {min, max, multiple_of} nearest to one inside the range (halves round up)."""
    lo, hi, mult = spec.get("min", 1), spec.get("max"), spec.get("multiple_of") or 1
    snapped = lo + max(0, math.floor((value - lo) / mult + 0.5)) * mult
    return int(snapped if hi is None else min(snapped, hi))


def _outside(value: float, spec: dict) -> bool:
    return value < spec.get("min", 0) or ("max" in spec and value > spec["max"])


def map_request(fields: dict, info: dict) -> dict:
    """OpenAI create fields → our generation request: `seconds` and `size` outside the model's limits are a
    422 naming the field and the allowed range; inside them, the nearest frame count at the model's fps and
    the nearest allowed width and height."""
    limits, defaults = info.get("limits", {}), info.get("defaults", {})
    asked = [name for name in ("seconds", "size") if fields.get(name) is not None]
    if asked and not limits:  # the frame rate and sizes come from the workers (an API-only box before them)
        raise HTTPException(
            503,
            f"{' and '.join(asked)}: the model's frame rate and limits are not known until a worker group "
            "has started; try again (or send the job without them, to run at the model's defaults)",
            headers={"Retry-After": "5"},
        )
    spec: dict = {"prompt": fields.get("prompt")}  # the prompt rules are both APIs': Services.check_prompts
    if fields.get(loras_mod.FIELD) is not None:  # read by _create_fields
        spec[loras_mod.FIELD] = fields[loras_mod.FIELD]
    if fields.get("seed") is not None:
        spec["seed"] = _seed(fields["seed"])
    if fields.get("seconds") is not None:
        seconds = _seconds(fields["seconds"])
        fps, frames = _fps(defaults), limits.get("num_frames", {})
        if _outside(Fraction(str(fields["seconds"])) * fps, frames):  # exactly, as the document's pattern
            lo, hi = frames.get("min", 1), frames.get("max")
            raise unprocessable(
                "seconds",
                # as given: `:g` rounded 2.06250000000001 onto the limit it passed, 2.0625
                f"seconds={fields['seconds']} is outside the model's limits: {lo / fps:g} to {hi / fps:g} "
                f"seconds ({lo} to {hi} frames at {fps} fps)",
            )
        spec["num_frames"] = _snap(seconds * fps, frames)
    if fields.get("size") is not None:
        size = text_field("size", fields["size"], max_chars=11)
        match = _SIZE.fullmatch(size)
        if not match:
            raise unprocessable("size", f"size={shown(size)} must be WIDTHxHEIGHT, e.g. 832x480")
        w, h = int(match[1]), int(match[2])
        lw, lh = limits.get("width", {}), limits.get("height", {})
        if 0 in (w, h) and not (lw and lh):  # with the model's limits, their message below says more
            raise unprocessable("size", f"size={size}: width and height must be at least 1")
        if _outside(w, lw) or _outside(h, lh):
            raise unprocessable(
                "size",
                f"size={size} is outside the model's limits: width {_range(lw)}, height {_range(lh)}",
            )
        spec |= {"width": _snap(w, lw), "height": _snap(h, lh)}
    return spec


def _fps(defaults: dict) -> int:
    return defaults.get("fps") or 16


def _range(spec: dict) -> str:
    step = f" in steps of {spec['multiple_of']}" if spec.get("multiple_of") else ""
    return f"{spec.get('min', 1)} to {spec.get('max')}{step}"


def _seconds(raw) -> float:
    """A duration in (0, 3600]: a number, or a string of ASCII digits ("4", "2.5") as the SDK sends it."""
    value = float(raw) if isinstance(raw, str) and _SECONDS.fullmatch(raw) else raw
    # bool is an int to Python; a huge JSON integer compares fine but would overflow float()
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
        raise unprocessable(
            "seconds",
            f'seconds={shown(raw)} must be a number in (0, 3600] (as a string: at most 6 decimals), e.g. "4"',
        )
    return float(value)


def _seed(raw) -> int:
    """A seed in [0, 2^63 - 1]: an integer (JSON's 7.0 is one), or ASCII digits as a form sends it."""
    value = int(raw) if isinstance(raw, str) and _SEED.fullmatch(raw) else integral(raw)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise unprocessable("seed", f"seed={shown(raw)} must be an integer from 0 to {MAX_SEED}")
    return value


def video_view(services: Services, job: Job) -> dict:
    defaults = services.worker_info().get("defaults", {})
    value = lambda name: job.spec.get(name, defaults.get(name))  # noqa: E731
    frames, fps = value("num_frames"), value("fps") or 16
    failed = job.status in ("failed", "cancelled")
    return {
        "id": job.id,
        "object": "video",
        "model": services.served_model(),  # what made the video, whatever model the request named
        "status": "failed" if failed else job.status,
        "progress": job.progress,
        "created_at": int(job.created_at),
        "completed_at": int(job.finished_at) if job.status == "completed" else None,
        "expires_at": services.expires_at(job),  # --keep-hours
        "prompt": job.spec.get("prompt"),
        # "" until a worker has published the model's limits (a request that left the size out)
        "size": "{}x{}".format(*size) if (size := services.video_size(job)) else "",
        "seconds": f"{frames / fps:g}" if frames else "",
        "error": {
            "code": "cancelled" if job.status == "cancelled" else "generation_failed",
            "message": job.error or job.status,
        }
        if failed
        else None,
        "warnings": services.warnings(job),  # not in OpenAI's Video: the SDK keeps extra fields
        "seed": job.spec.get("seed"),  # the same: send it back to make the same video
    }


async def _create_fields(request: Request) -> dict:
    form = media_type(request, "application/json", *_FORMS) in _FORMS
    if form:
        fields = await form_fields(request, _IMAGE)
    else:
        fields = await json_fields(request)
        if not isinstance(fields, dict):
            raise HTTPException(422, "body must be a JSON object")
    for key in fields:
        if key not in _FIELDS:
            raise unprocessable(key, f"unknown field {shown(key)}; allowed: {sorted(_FIELDS)}")
    if fields.get(loras_mod.FIELD) is not None:
        try:  # form values are text: "0.8" is 0.8
            fields[loras_mod.FIELD] = loras_mod.parse(fields[loras_mod.FIELD], strict=not form)
        except ValueError as e:
            raise unprocessable(loras_mod.FIELD, str(e)) from None
    return fields


def _create(services: Services, fields: dict, idempotency_key: str | None):
    model = fields.get("model")
    if model is not None:
        text_field("model", model, max_chars=MAX_MODEL_CHARS)
    spec = map_request(fields, services.worker_info())
    # the image counts by its hash (`submit`); a null is a field left out
    body = {k: v for k, v in fields.items() if k != _IMAGE and v is not None}
    for name in ("loras", "seed"):  # in their one spelling: the set however ordered, 7 as "7" or 7.0
        if name in spec:
            body[name] = spec[name]
    if body.get("seconds") is not None:  # 4, "4" and "4.0" alike (map_request took it: a number)
        body["seconds"] = str(Fraction(str(body["seconds"])))
    job, created = services.submit(
        spec,
        image=fields.get(_IMAGE),
        image_field=_IMAGE,
        meta={"model": model},  # the model the client named, for the record: the reply names the served one
        idempotency_key=idempotency_key,
        scope="v1",
        body=body,
    )
    return submitted(video_view(services, job), created, 200)


@router.post(
    "",
    openapi_extra={"requestBody": _CREATE_BODY},
    responses=reply(Video) | responses(400, 401, 409, 413, 415, 422, 429, 503, openai=True),
)
async def create_video(request: Request, idempotency_key: IdempotencyKey = None):
    fields = await _create_fields(request)
    return await run_in_threadpool(_create, svc(request), fields, idempotency_key)


@router.get("", responses=reply(VideoList) | responses(401, 404, 422, 503, openai=True))
def list_videos(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
    order: Literal["asc", "desc"] = "desc",
):
    services = svc(request)
    jobs, has_more = services.page(limit=limit, after=after, order=order)
    data = [video_view(services, j) for j in jobs]
    return {
        "object": "list",
        "data": data,
        "has_more": has_more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


@router.get("/{video_id}", responses=reply(Video) | responses(401, 404, 503, openai=True))
def retrieve_video(request: Request, video_id: str):
    services = svc(request)
    return video_view(services, services.job(video_id))


@router.delete("/{video_id}", responses=reply(VideoDeleted) | responses(401, 404, 503, openai=True))
def delete_video(request: Request, video_id: str):
    """Cancels the job if it is still queued or running, hides it and removes its video."""
    services = svc(request)
    job = services.cancel(video_id, delete=True)
    return {"id": job.id, "object": "video.deleted", "deleted": True}


_CONTENT_ROUTE = {
    "response_class": FileResponse,
    "responses": {200: {"content": VIDEO[200]["content"] | PREVIEW[200]["content"]}}
    | PARTS
    | responses(401, 404, 416, 422, 503, openai=True),
}


@router.get("/{video_id}/content", **_CONTENT_ROUTE)
@router.head("/{video_id}/content", **_CONTENT_ROUTE)
def video_content(request: Request, video_id: str, variant: Literal["video", "thumbnail"] = "video"):
    """`variant=thumbnail`: the latest live preview as a WebP, while the job runs and after it ends."""
    if variant == "thumbnail":
        return preview_file(request, video_id)
    return video_file(request, video_id)
