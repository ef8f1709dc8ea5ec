"""Files (videos, the web page's own files) served with the validators a browser revalidates with: a GET or
HEAD whose If-None-Match names the file's ETag is answered 304 with no body (RFC 9110 §13.1.2), so the page's
script (Cache-Control: no-cache) and an MP4 already held cost a round trip, not a download. A Range in a unit
other than bytes is ignored, as §14.2 requires (Starlette answers it 400), and the whole file is served."""

from __future__ import annotations

import os

import anyio
from fastapi import HTTPException
from starlette.datastructures import Headers
from starlette.responses import FileResponse, Response

# what a 304 repeats of the 200 it stands for (§15.4.5)
_KEPT = ("etag", "last-modified", "cache-control", "content-location", "expires", "vary")


class ConditionalFile(FileResponse):
    async def __call__(self, scope, receive, send) -> None:
        if self.stat_result is None:
            try:  # a job deleted between its lookup and now: its file is gone, the job too
                self.stat_result = await anyio.to_thread.run_sync(os.stat, self.path)
            except FileNotFoundError:
                raise HTTPException(404, "the file was deleted meanwhile") from None
            self.set_stat_headers(self.stat_result)
        headers = Headers(scope=scope)
        etag = self.headers["etag"]
        if scope["method"] in ("GET", "HEAD") and _matches(headers.get("if-none-match"), etag):
            kept = {name: value for name, value in self.headers.items() if name in _KEPT}
            await Response(status_code=304, headers=kept)(scope, receive, send)
            return
        unit = headers.get("range", "bytes=").split("=", 1)[0]
        if unit.strip().lower() != "bytes":
            scope = dict(scope, headers=[(k, v) for k, v in scope["headers"] if k.lower() != b"range"])
        await super().__call__(scope, receive, send)


def _matches(if_none_match: str | None, etag: str) -> bool:
    """Weak comparison (§13.1.2): W/"x" matches "x"; `*` matches any file."""
    if if_none_match is None:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in if_none_match.split(",")]
    return "*" in tags or etag.removeprefix("W/") in tags
