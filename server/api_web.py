"""The web page (`GET /` and its files under /web/) and the route it builds its form from, `GET /limits`.

The page is plain HTML, JS and CSS shipped in server/web/: no build step, nothing fetched from elsewhere. It
and its files are public (the API-key guard lets `PAGE_FILES` through); every API call the page makes
carries the key as any client's does (`Authorization: Bearer`).
"""

from __future__ import annotations

import os

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel
from starlette.responses import FileResponse

from server.api_jobs import svc
from server.openai_errors import NativeError, responses

router = APIRouter()
WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")
PAGE_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/web/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/web/style.css": ("style.css", "text/css; charset=utf-8"),
}
# Nothing but this server: the page's own script and style, previews and videos as blob: URLs.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' blob:; media-src 'self' blob:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
}
LIMITS_RETRY_S = 2


class LimitsView(BaseModel):
    model: str | None
    limits: dict
    defaults: dict
    vocabulary: dict | None = None  # {"about", "words"}: the words a small model knows (dit.vocabulary)


def _page_file(path: str):
    name, media_type = PAGE_FILES[path]

    def serve() -> FileResponse:
        return FileResponse(os.path.join(WEB_DIR, name), media_type=media_type, headers=_HEADERS)

    return serve


for _path in PAGE_FILES:
    router.add_api_route(_path, _page_file(_path), methods=["GET", "HEAD"], include_in_schema=False)


@router.get(
    "/limits",
    response_model=LimitsView,
    responses=responses(401)
    | {
        503: {
            "model": NativeError,
            "description": "No worker has published the model's limits yet (the model is loading), or "
            "the job store is busy; retry after Retry-After seconds",
        }
    },
)
def get_limits(request: Request):
    """The loaded model, its request limits (`{field: {"min", "max", "multiple_of"?, "default"?}}`, the
    prompts' `max_tokens`, `image`: whether it takes a first frame), the defaults a request gets and the
    `vocabulary` a small model declares (else null), as the workers published them."""
    info = svc(request).worker_info()
    if "limits" not in info:
        raise HTTPException(
            503,
            "no worker has published the model's limits yet (the model is loading); retry shortly",
            headers={"Retry-After": str(LIMITS_RETRY_S)},
        )
    return {
        "model": info.get("model"),
        "limits": info["limits"],
        "defaults": info.get("defaults", {}),
        "vocabulary": info.get("vocabulary"),
    }
