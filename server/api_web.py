"""The web page (`GET /` and its files under /web/), the route it builds its form from, `GET /limits`, and
the LoRA catalogue, `GET /loras`.

The page is plain HTML, JS and CSS shipped in server/web/: no build step, nothing fetched from elsewhere. It
and its files are public (the API-key guard lets `PAGE_FILES` through); every API call the page makes
carries the key as any client's does (`Authorization: Bearer`).
"""

from __future__ import annotations

import os

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel

from dit.request import MAX_LORA_STRENGTH
from server.api_jobs import svc
from server.file_response import ConditionalFile
from server.openai_errors import NativeError, responses

router = APIRouter()
WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")
PAGE_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/web/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/web/style.css": ("style.css", "text/css; charset=utf-8"),
    "/web/icon.svg": ("icon.svg", "image/svg+xml"),  # named by the page, so no browser asks /favicon.ico
}
# Nothing but this server: the page's own script and style, previews and videos as blob: URLs.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' blob:; media-src 'self' blob:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
}
LIMITS_RETRY_S = 2


class LoraEntry(BaseModel):
    name: str
    experts: bool  # a pair of files, one per expert of a two-expert model (Wan2.2 A14B)
    fits: bool  # its keys and shapes fit the loaded model: a request may name it
    error: str | None  # why it does not fit


class LimitsView(BaseModel):
    model: str | None
    limits: dict
    defaults: dict
    vocabulary: dict | None = None  # {"about", "words"}: the words a small model knows (dit.vocabulary)
    loras: list[LoraEntry] | None = None  # the LoRA catalogue (GET /loras); null: no --lora-dir


class LorasView(BaseModel):
    catalogue: bool  # the server was started with --lora-dir
    max_strength: float  # a request's strengths lie in [-max_strength, max_strength]
    data: list[LoraEntry]


def _page_file(path: str):
    name, media_type = PAGE_FILES[path]

    def serve() -> ConditionalFile:
        return ConditionalFile(os.path.join(WEB_DIR, name), media_type=media_type, headers=_HEADERS)

    return serve


for _path in PAGE_FILES:
    router.add_api_route(_path, _page_file(_path), methods=["GET", "HEAD"], include_in_schema=False)


_PUBLISHED = responses(401) | {
    503: {
        "model": NativeError,
        "description": "No worker has published the model's limits yet (the model is loading), or "
        "the job store is busy; retry after Retry-After seconds",
    }
}


def _published(request: Request) -> dict:
    """What the workers published; 503 before they have."""
    services = svc(request)
    info = services.worker_info()
    if "limits" not in info:
        # without a group of its own (--no-workers) this server waits for one started apart
        why = "the model is loading" if services.supervisor is not None else "no worker group has joined yet"
        raise HTTPException(
            503,
            f"no worker has published the model's limits yet ({why}); retry shortly",
            headers={"Retry-After": str(LIMITS_RETRY_S)},
        )
    return info


@router.get("/limits", response_model=LimitsView, responses=_PUBLISHED)
def get_limits(request: Request):
    """The loaded model, its request limits (`{field: {"min", "max", "multiple_of"?, "default"?}}`, the
    prompts' `max_tokens`, `image`: whether it takes a first frame), the defaults a request gets, the
    `vocabulary` a small model declares (else null) and the LoRA catalogue (`loras`, as GET /loras lists
    it; null without --lora-dir), as the workers published them."""
    info = _published(request)
    return {
        "model": info.get("model"),
        "limits": info["limits"],
        "defaults": info.get("defaults", {}),
        "vocabulary": info.get("vocabulary"),
        "loras": info.get("loras"),
    }


@router.get("/loras", response_model=LorasView, responses=_PUBLISHED)
def get_loras(request: Request):
    """The LoRAs a request may name in `loras` (`ithaca serve --lora-dir`): each with whether it is a pair
    for a two-expert model, whether it fits the loaded model, and why not; files added to the folder appear
    within seconds (the worker leaders rescan it every heartbeat). `catalogue` false: the server was started
    without --lora-dir."""
    catalogue = _published(request).get("loras")
    return {"catalogue": catalogue is not None, "max_strength": MAX_LORA_STRENGTH, "data": catalogue or []}
