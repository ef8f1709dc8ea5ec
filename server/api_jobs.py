"""The native jobs API: /generate, /jobs, /jobs/{id}, /jobs/{id}/events (SSE), /jobs/{id}/video,
/jobs/{id}/preview.

/generate takes JSON (the first-frame image of an image-to-video model as a data URL in `image`), or
multipart/form-data with the same fields and `image` as a file part. It reads either body itself, off the
event loop (a JSON one with its data URL cut out: images.parse_json), and answers in FastAPI's shape; the
document describes both bodies (`_GENERATE_BODY`)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import re
import time
from typing import Annotated, Literal
from urllib.parse import parse_qsl

from fastapi import APIRouter, Header, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from dit import cache_config
from dit.cache_config import CacheConfig
from dit.request import BLANK_CLASS, MAX_SEED
from server import images, signed_links, videos
from server import limits as limits_mod
from server import loras as loras_mod
from server.file_response import PARTS, ConditionalFile
from server.jsonsafe import SafeJSONResponse, render, shown
from server.openai_errors import responses
from server.replies import JobList, JobView, Links, Status, reply
from server.services import MAX_PROMPT_CHARS, Services, unprocessable
from server.store import Job, StoreBusy

# Routes that touch the job store are plain `def`: FastAPI runs them in its thread pool, so a store held
# by another process never stalls the event loop (and /health with it).
router = APIRouter()
SSE_POLL_S = 0.1
# a comment line on an event stream that has sent nothing for this long (a job queued behind a long one): a
# proxy's idle timeout (nginx: 60 s) would drop a silent stream
SSE_KEEPALIVE_S = 15.0
_BIG = 1_000_000
VIDEO = {200: {"content": {"video/mp4": {"schema": {"type": "string", "format": "binary"}}}}}
PREVIEW = {200: {"content": {"image/webp": {"schema": {"type": "string", "format": "binary"}}}}}
MULTIPART = "multipart/form-data"
URLENCODED = "application/x-www-form-urlencoded"
_MAX_FIELDS = 1000  # Starlette's bound for a multipart form
_GENERATE_TYPES = ("application/json", MULTIPART)
# /generate's bodies in the OpenAPI document; `schema_with_limits` writes both schemas
_GENERATE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/GenerateBody"}},
            MULTIPART: {
                "schema": {"$ref": "#/components/schemas/GenerateForm"},
                "encoding": {
                    "image": {"contentType": "image/png, image/jpeg, image/webp"},
                    "loras": {"contentType": "application/json"},  # a part per LoRA, or one array
                },
            },
        },
    }
}
# Each Server-Sent Event of /jobs/{id}/events (an OpenAPI 3.1 event-stream schema describes one event)
_EVENT = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"enum": ["progress", "preview", "done", "deleted"]},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {"type": "object"},
        },
    },
}


# checked by `Services.submit` (a 400 saying so); the document says it too
IdempotencyKey = Annotated[str | None, Header(json_schema_extra={"minLength": 1, "maxLength": 255})]


def integral(value):
    """JSON's 9.0 is an integer (JSON Schema says so): as an int; any other value as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


class GenerateBody(BaseModel):
    """Unknown fields are refused; ranges beyond these sanity bounds come from the loaded model's limits
    (the OpenAPI document shows the published ones), the prompts' token limit from its tokenizer."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    negative_prompt: str = Field("", max_length=MAX_PROMPT_CHARS)
    num_frames: int | None = Field(None, ge=1, le=_BIG)
    height: int | None = Field(None, ge=1, le=_BIG)
    width: int | None = Field(None, ge=1, le=_BIG)
    num_inference_steps: int | None = Field(None, ge=1, le=10_000)
    guidance_scale: float | None = Field(None, ge=0.0, le=1000.0, allow_inf_nan=False)
    guidance_scale_2: float | None = Field(
        None,
        ge=0.0,
        le=1000.0,
        allow_inf_nan=False,
        description="a two-expert model's (Wan2.2 A14B) guidance below its boundary "
        "(default: guidance_scale)",
    )
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    fps: int | None = Field(None, ge=1, le=1000)
    cache: str | None = Field(
        None,
        max_length=32,
        pattern=cache_config.PATTERN,  # what the document says; `_cache_rule` says it in words first
        description="step caching: off | fbcache[:THRESHOLD], threshold 0–1 (default: the server's)",
        examples=["fbcache:0.05"],
    )
    image: str | None = Field(
        None,
        description="the first frame of an image-to-video model: PNG, JPEG or WebP as a data URL "
        "(data:image/png;base64,...), or in multipart/form-data a file part",
    )
    loras: list[loras_mod.LoraItem] | None = Field(
        None, max_length=loras_mod.MAX_LORAS, description=loras_mod.DESCRIPTION
    )

    @field_validator("num_frames", "height", "width", "num_inference_steps", "seed", "fps", mode="before")
    @classmethod
    def _integral(cls, value):
        """9.0 taken as 9 (`integral`); strict pydantic would refuse it."""
        return integral(value)

    @field_validator("negative_prompt", mode="before")
    @classmethod
    def _no_negative_prompt(cls, value):
        """null is the field left out, as for every other field (it alone was refused)."""
        return "" if value is None else value

    @field_validator("cache", mode="before")
    @classmethod
    def _cache_rule(cls, value):
        """A string the pattern refuses, refused in words (pydantic's message would quote the pattern)."""
        if isinstance(value, str) and not re.fullmatch(cache_config.PATTERN, value):
            raise ValueError(f"{cache_config.RULE}, got {shown(value)}")
        return value

    @field_validator("cache")
    @classmethod
    def _cache(cls, value: str | None) -> str | None:
        return None if value is None else str(CacheConfig.parse(value))  # ValueError → 422 naming the field


_NUMBERS = [
    name for name, f in GenerateBody.model_fields.items() if f.annotation in (int | None, float | None)
]
_FORM_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")  # as JSON writes one (leading zeros too)


def _form_numbers(fields: dict) -> dict:
    """A form's number fields as JSON would carry them ("17" is 17, "2.5" is 2.5); other text stays text, to
    be refused as JSON's would be (Python's own parse took "1_0" as 10, " 7" and "+7" as 7)."""
    numbers = {}
    for name in _NUMBERS:
        text = fields.get(name)
        if isinstance(text, str) and _FORM_NUMBER.fullmatch(text):
            with contextlib.suppress(ValueError):  # over Python's 4300 digits: refused as text
                numbers[name] = int(text) if text.lstrip("-").isdigit() else float(text)
    return fields | numbers


# The text rules (services.text_field) as the document states them: no NUL, and a prompt not blank
# (`dit.request.blank`)
TEXT_PATTERN = r"^[^\x00]*$"
PROMPT_PATTERN = rf"^[^\x00]*[^\x00{BLANK_CLASS}][^\x00]*$"


def schema_with_limits(document: dict, info: dict) -> dict:
    """The OpenAPI document with the published limits of the loaded model on /generate's fields (`info`: what
    the workers published), and the names of its LoRA catalogue."""
    document, limits = copy.deepcopy(document), info.get("limits", {})
    # the route reads its body itself; pydantic's schema is exact (FastAPI's made seed's 2**63 - 1 a float)
    body = GenerateBody.model_json_schema(ref_template="#/components/schemas/{model}")
    document["components"]["schemas"] |= body.pop("$defs") | {"GenerateBody": body}
    fields = body["properties"]
    if "limits" in info:  # published: the catalogue's names, or no field where a request can name none
        names = loras_mod.describe(document["components"]["schemas"]["LoraItem"], info.get("loras"))
        if names is None:
            del fields["loras"]
        else:
            fields["loras"] = names
    fields["prompt"]["pattern"], fields["negative_prompt"]["pattern"] = PROMPT_PATTERN, TEXT_PATTERN
    for name, spec in limits.items():
        for branch in fields.get(name, {}).get("anyOf", []):
            if branch.get("type") not in ("integer", "number"):
                continue
            branch |= {
                key: spec[bound] for bound, key in (("min", "minimum"), ("max", "maximum")) if bound in spec
            }
            step, lo = spec.get("multiple_of"), spec.get("min", 0)
            if step and lo % step == 0:
                branch["multipleOf"] = step
            elif step and "max" in spec:  # frames (4k+1) are not a multiple of anything: each value
                branch["enum"] = list(range(lo, spec["max"] + 1, step))
        if "max_tokens" in spec and name in fields:
            fields[name]["description"] = f"at most {spec['max_tokens']} tokens (the model's tokenizer)"
        if "timesteps" in spec and name in fields:
            fields[name]["description"] = limits_mod.fixed_steps(spec)
    if "guidance_scale" in limits and "guidance_scale_2" not in limits:  # a model of one expert refuses it
        del fields["guidance_scale_2"]
    if "image" in limits and not limits_mod.accepts_image(limits["image"]):  # a text-to-video model's
        del fields["image"]
    elif "image" in limits:
        fields["image"]["description"] = limits_mod.image_rule(limits["image"])
    schemas = document["components"]["schemas"]
    schemas["GenerateForm"] = _form_schema(schemas["GenerateBody"])
    return document


def _form_schema(body: dict) -> dict:
    """GenerateBody as form parts: text, so no null (a field left out takes its default); `image` a file."""
    fields = {}
    for name, spec in body["properties"].items():
        kinds = [branch for branch in spec.get("anyOf", [spec]) if branch.get("type") != "null"]
        fields[name] = {k: v for k, v in spec.items() if k != "anyOf" and v is not None} | kinds[0]
    if "image" in fields:
        fields["image"] |= {"format": "binary"}
    return body | {"properties": fields, "title": "GenerateForm"}


def svc(request: Request) -> Services:
    return request.app.state.services


def _media_type(headers: Headers) -> str:
    return headers.get("content-type", "").split(";")[0].strip().lower()


def media_type(request: Request, *allowed: str) -> str:
    """The body's media type; 415 unless it is one of `allowed` (a body is never guessed to be JSON)."""
    kind = _media_type(request.headers)
    if kind not in allowed:
        raise HTTPException(
            415, f"Content-Type {shown(kind)} is not accepted here; send {' or '.join(allowed)}"
        )
    return kind


async def form_fields(request: Request, file_field: str) -> dict:
    """A form's fields, text as it came; `file_field` alone may be a file part (its bytes). A text part may
    be as long as the body (a data URL in it, URL-encoded up to thrice its length in a urlencoded form): the
    middleware bounds the body, the fields' own rules the other fields."""
    if _media_type(request.headers) == URLENCODED:
        form, items = None, _urlencoded(await request.body())
    else:
        config = svc(request).config
        form = await _multipart(request, config.max_body_bytes + images.room(config.max_image_bytes))
        items = form.multi_items()
    parts = []
    try:
        for key, item in items:
            if isinstance(item, UploadFile):
                if key != file_field:
                    raise unprocessable(key, f"{shown(key)} cannot be a file; only {file_field} can")
                item = await item.read()
            parts.append((key, item))
    finally:
        if form is not None:
            await form.close()  # a file part's spooled file
    try:
        parts, loras = loras_mod.form_items(parts)  # a repeated field: one part per LoRA
    except ValueError as e:
        raise unprocessable(loras_mod.FIELD, str(e)) from None
    keys = [key for key, _ in parts]
    for key in keys:  # any other given twice: which one was meant is not for the server to guess
        if keys.count(key) > 1:
            raise unprocessable(key, f"{shown(key)} is given {keys.count(key)} times; give it once")
    return dict(parts) | ({} if loras is None else {loras_mod.FIELD: loras})


class _TextPartsInTheirCharset(MultiPartParser):
    """Starlette's multipart parser, except that a text part its charset (UTF-8 unless the request says)
    cannot decode is refused: Starlette read it as Latin-1, and a prompt of such bytes became other text in
    silence (a urlencoded form's is a 400)."""

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None:
            try:
                bytes(part.data).decode(self._charset)
            except (UnicodeDecodeError, LookupError):
                raise MultiPartException(
                    f"the form's part {shown(part.field_name)} is not {self._charset}"
                ) from None
        super().on_part_end()


async def _multipart(request: Request, max_part_size: int) -> FormData:
    try:
        async with contextlib.aclosing(request.stream()) as stream:
            return await _TextPartsInTheirCharset(
                request.headers, stream, max_part_size=max_part_size
            ).parse()
    except MultiPartException as e:
        raise HTTPException(400, e.message) from None


def _urlencoded(body: bytes) -> list[tuple[str, str]]:
    """A urlencoded form's fields, read as UTF-8 (its only charset). Starlette reads the bytes as Latin-1,
    so `curl -d 'prompt=café'` (raw UTF-8, not percent-encoded) would become "cafÃ©"."""
    try:
        return parse_qsl(body.decode(), keep_blank_values=True, errors="strict", max_num_fields=_MAX_FIELDS)
    except UnicodeDecodeError:
        raise HTTPException(400, "the form is not UTF-8 (raw or percent-encoded)") from None
    except ValueError:  # more fields than any request has
        raise HTTPException(400, f"the form has more than {_MAX_FIELDS} fields") from None


def job_view(services: Services, job: Job) -> dict:
    return {
        "id": job.id,
        "status": job.status,
        "phase": job.phase,
        "progress": job.progress,
        "step": job.step,
        "total_steps": job.total_steps,
        "queue_position": services.store.queue_position(job),
        "request": job.spec,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "expires_at": services.expires_at(job),  # --keep-hours deletes the job then; null: kept
        "timings": job.timings,
        "attempts": job.attempts,
        "resumed_from_step": job.resumed_from_step,
        "batch": job.batch,
        "worker": job.worker,
        "cancel_requested": job.cancel_requested,
        "error": job.error,
        "warnings": services.warnings(job),
        "video_url": _video_url(job),
        "preview_step": job.preview_step,
        "preview_url": _preview_url(job),
    }


def _video_url(job: Job) -> str | None:
    return f"/jobs/{job.id}/video" if job.status == "completed" else None


def _preview_url(job: Job) -> str | None:
    return f"/jobs/{job.id}/preview" if job.preview_step is not None else None


@router.post(
    "/generate",
    status_code=202,
    responses=reply(JobView, 202) | responses(400, 401, 409, 413, 415, 422, 429, 503),
    openapi_extra=_GENERATE_BODY,
)
async def generate(request: Request, idempotency_key: IdempotencyKey = None):
    form = media_type(request, *_GENERATE_TYPES) == MULTIPART
    if form:
        fields = await form_fields(request, "image")
        image = fields.pop("image", None)  # a file's bytes, or a data URL as text
    else:
        fields = await json_fields(request)
    try:
        body = GenerateBody.model_validate(_form_numbers(fields) if form else fields)
    except ValidationError as e:  # in FastAPI's own shape
        errors = e.errors(include_url=False)
        published = {}
        if any(err["type"] in _BOUND_ERRORS for err in errors):
            published = (await run_in_threadpool(svc(request).worker_info)).get("limits", {})
        errors = [_in_words(err, published) for err in errors]
        raise RequestValidationError([err | {"loc": ("body", *err["loc"])} for err in errors]) from None
    image = image if form else body.image
    return await run_in_threadpool(_generate, svc(request), body, image, idempotency_key)


_BOUND_ERRORS = ("greater_than_equal", "less_than_equal", "greater_than", "less_than")


def _in_words(error: dict, published: dict) -> dict:
    """pydantic's error in the API's words: an unknown field names the allowed ones (as /v1's do); a sanity
    bound's error (height 0: "greater than or equal to 1") in the loaded model's words where it published the
    field's range ("height=0 is out of range: allowed 16..256 in steps of 16")."""
    if not error["loc"]:  # the body's own (a key pydantic cannot name)
        return error
    (field, *inner), value = error["loc"], error.get("input")
    if error["type"] == "extra_forbidden" and not inner:
        return error | {"msg": f"unknown field {shown(field)}; allowed: {sorted(GenerateBody.model_fields)}"}
    if error["type"] not in _BOUND_ERRORS or inner or field not in published:
        return error
    said = dict(limits_mod.check({field: value}, {field: published[field]}))
    return error | {"msg": said[field]} if field in said else error


async def json_fields(request: Request):
    """The JSON body, parsed off the event loop (images.parse_json: a data URL cut out first); a body that
    cannot be read is a 400 saying why (both APIs)."""
    try:
        return await run_in_threadpool(images.parse_json, await request.body())
    except json.JSONDecodeError as e:
        raise HTTPException(400, f"the body is not valid JSON: {e.msg} at character {e.pos}") from None
    except images.DuplicateKey as e:  # as a form's field given twice (`form_fields`), where it is
        said = f"{shown(e.path[-1])} is given {e.times} times; give it once"
        raise HTTPException(422, [{"loc": ["body", *e.path], "msg": said, "type": "value_error"}]) from None
    except (UnicodeDecodeError, RecursionError):  # not UTF-8/16/32, or nested past Python's recursion limit
        raise HTTPException(400, "the body is not readable JSON: not UTF-8, or nested too deeply") from None
    except ValueError:  # Python's int() limit: a number of more than 4300 digits
        raise HTTPException(400, "the body is not readable JSON: a number of more than 4300 digits") from None


def _generate(services: Services, body: GenerateBody, image: bytes | str | None, idempotency_key: str | None):
    spec = body.model_dump(exclude_none=True, exclude={"image", "loras"})
    if body.loras:
        spec["loras"] = loras_mod.as_spec(body.loras)
    job, created = services.submit(
        spec, image=image, idempotency_key=idempotency_key, scope="generate", body=spec
    )
    return submitted(job_view(services, job), created, 202)


def submitted(view: dict, created: bool, status: int) -> SafeJSONResponse:
    """A submit's reply; a job an Idempotency-Key replays says so (both APIs)."""
    headers = {} if created else {"Idempotent-Replayed": "true"}
    return SafeJSONResponse(view, status_code=status, headers=headers)


@router.get("/jobs", responses=reply(JobList) | responses(401, 404, 422, 503))
def list_jobs(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
    order: Literal["asc", "desc"] = "desc",
    status: Status | None = None,
):
    services = svc(request)
    jobs, has_more = services.page(limit=limit, after=after, order=order, status=status)
    return {
        "data": [job_view(services, j) for j in jobs],
        "has_more": has_more,
        "last_id": jobs[-1].id if jobs else None,
    }


@router.get("/jobs/{job_id}", responses=reply(JobView) | responses(401, 404, 503))
def get_job(request: Request, job_id: str):
    services = svc(request)
    return SafeJSONResponse(
        job_view(services, services.job(job_id))
    )  # the hot poll path: no jsonable_encoder


@router.delete("/jobs/{job_id}", responses=reply(JobView) | responses(401, 404, 409, 503))
def cancel_job(request: Request, job_id: str):
    services = svc(request)
    return job_view(services, services.cancel(job_id))


def video_file(request: Request, job_id: str) -> ConditionalFile:
    """The finished MP4 of a job (404 until completed); both APIs serve it this way."""
    services = svc(request)
    job = services.job(job_id)
    config = services.config
    if job.status == "completed" and job.video and not os.path.isfile(videos.video_file(config, job)):
        raise HTTPException(404, videos.missing_video(config, job))  # e.g. another box's, not shared
    # private: a signed link's request has no Authorization, which alone kept a shared cache (a proxy, a CDN)
    # from storing the video and serving it past the link's end or the job's deletion
    path, private = services.video_path(job), {"Cache-Control": "private"}
    return ConditionalFile(path, media_type="video/mp4", filename=f"{job.id}.mp4", headers=private)


_LINKED = {"openapi_extra": {"parameters": signed_links.QUERY}}
_VIDEO_ROUTE = {
    "response_class": FileResponse,
    "responses": VIDEO | PARTS | responses(401, 404, 416, 503),
    **_LINKED,
}


@router.get("/jobs/{job_id}/video", **_VIDEO_ROUTE)
@router.head("/jobs/{job_id}/video", **_VIDEO_ROUTE)  # a download's size and type before the download
def get_video(request: Request, job_id: str):
    return video_file(request, job_id)


def preview_file(request: Request, job_id: str) -> Response:
    """The latest live preview of a job (404 before the first); both APIs serve it this way. Read whole (a
    few KB): the worker replaces the file as it runs, so it is never streamed after a stat gone stale."""
    services = svc(request)
    webp = services.preview(services.job(job_id))
    return Response(webp, media_type="image/webp", headers={"Cache-Control": "no-store"})


_PREVIEW_ROUTE = {"response_class": Response, "responses": PREVIEW | responses(401, 404, 503), **_LINKED}


@router.get("/jobs/{job_id}/preview", **_PREVIEW_ROUTE)
@router.head("/jobs/{job_id}/preview", **_PREVIEW_ROUTE)
def get_preview(request: Request, job_id: str):
    return preview_file(request, job_id)


@router.get("/jobs/{job_id}/links", responses=reply(Links) | responses(401, 404, 503))
def get_links(request: Request, job_id: str):
    """The job's video and preview (null as in the job) as links that open without the key until
    `expires_at`, an hour on or a few minutes more (server.signed_links): for a browser's <video> or
    download, which cannot send the header. Without a key set, the plain paths, which do not expire."""
    services = svc(request)
    job, key = services.job(job_id), services.config.api_key
    expires = signed_links.expiry(time.time()) if key else None

    def link(path: str | None) -> str | None:
        return signed_links.signed(key, path, expires) if key and path else path

    return {"video_url": link(_video_url(job)), "preview_url": link(_preview_url(job)), "expires_at": expires}


def _current_view(services: Services, job_id: str) -> dict | None:
    job = services.store.get(job_id)
    return None if job is None else job_view(services, job)  # None: deleted meanwhile (/v1/videos)


# A change of what makes a `progress` event: a cancel asked by another client, or the step count known once a
# worker validated the request, changed nothing else for a while (the page said neither)
_FOLLOWED = ("status", "phase", "step", "total_steps", "progress", "queue_position", "cancel_requested")


@router.get(
    "/jobs/{job_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {"schema": _EVENT}}}} | responses(401, 404, 503),
)
def job_events(request: Request, job_id: str):
    """Server-Sent Events: a `progress` event whenever the job changes (`_FOLLOWED`: status, phase, step and
    step count, progress, place in the queue, a cancel asked: the decode moves progress alone), a
    `: keep-alive` comment after `SSE_KEEPALIVE_S` without one, a `preview` event ({"step", "url"}) whenever
    a newer live preview is in place (a re-queued job's run's too; {"step", "url", "video": true} once the
    completed job's is its video's middle frame), then one final `done` event, or `deleted` ({"id",
    "deleted": true}) when the job is deleted meanwhile."""
    services = svc(request)
    services.job(job_id)  # 404 before the stream starts

    async def stream():
        last = last_preview = None
        said = time.monotonic()
        while True:
            try:
                view = await run_in_threadpool(_current_view, services, job_id)
            except StoreBusy:  # the headers are sent: skip this poll rather than break the stream
                await asyncio.sleep(SSE_POLL_S)
                continue
            if view is None:  # deleted (/v1/videos): said, so a client can tell it from a dropped stream
                yield f"event: deleted\ndata: {render({'id': job_id, 'deleted': True}).decode()}\n\n"
                return
            terminal = view["status"] in ("completed", "failed", "cancelled")
            # a run after a re-queue shows its steps again; a completed job's is the video's own frame
            shown = (view["preview_step"], view["attempts"], view["status"] == "completed")
            if view["preview_step"] is not None and shown != last_preview:
                last_preview, said = shown, time.monotonic()
                preview = {"step": view["preview_step"], "url": view["preview_url"]} | (
                    {"video": True} if shown[2] else {}
                )
                yield f"event: preview\ndata: {render(preview).decode()}\n\n"
            key = tuple(view[name] for name in _FOLLOWED)
            if key != last:
                last, said = key, time.monotonic()
                yield f"event: {'done' if terminal else 'progress'}\ndata: {render(view).decode()}\n\n"
            elif time.monotonic() - said >= SSE_KEEPALIVE_S:
                said = time.monotonic()
                yield ": keep-alive\n\n"
            if terminal or services.closing.is_set() or await request.is_disconnected():
                return  # closing: a client opens the stream again where the server comes back
            await asyncio.sleep(SSE_POLL_S)

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
