"""Files (videos, the web page's own files) served with the validators a browser revalidates with: a GET or
HEAD whose If-None-Match names the file's ETag is answered 304 with no body (RFC 9110 §13.1.2), so the page's
script (Cache-Control: no-cache) and an MP4 already held cost a round trip, not a download. A Range that
cannot be read (another unit, a malformed set) is ignored, as §14.2 allows (Starlette answers it a plain-text
400), and the whole file is served; a set of ranges is served as far as it starts within the file, and one
wholly past the file's end is a 416 in the route's error shape.

The file is opened before anything is sent and served from that descriptor: a video deleted meanwhile is a
404, or served whole, never a 200 whose body stops short."""

from __future__ import annotations

import os
from contextlib import asynccontextmanager

import anyio
from fastapi import HTTPException
from starlette.datastructures import Headers
from starlette.responses import FileResponse, MalformedRangeHeader, RangeNotSatisfiable, Response

from server.openai_errors import error_response

# what a 304 repeats of the 200 it stands for (§15.4.5)
_KEPT = ("etag", "last-modified", "cache-control", "content-location", "expires", "vary")
# the replies of a file's route besides its 200 and its errors, for the OpenAPI document
PARTS = {
    206: {"description": "The part (or parts) of the file a Range asked for"},
    304: {"description": "Not modified: If-None-Match names the file's ETag"},
}


class ConditionalFile(FileResponse):
    _file: anyio.AsyncFile | None = None

    async def __call__(self, scope, receive, send) -> None:
        try:  # a job deleted between its lookup and now: its file is gone, the job too
            self._file = await anyio.open_file(self.path, "rb")
        except FileNotFoundError:
            raise HTTPException(404, "the file was deleted meanwhile") from None
        try:
            self.stat_result = os.fstat(self._file.wrapped.fileno())
            self.set_stat_headers(self.stat_result)
            await self._answer(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._file.aclose()

    async def _answer(self, scope, receive, send) -> None:
        headers = Headers(scope=scope)
        etag = self.headers["etag"]
        if scope["method"] in ("GET", "HEAD") and _matches(headers.get("if-none-match"), etag):
            kept = {name: value for name, value in self.headers.items() if name in _KEPT}
            await Response(status_code=304, headers=kept)(scope, receive, send)
            return
        asked, condition = headers.get("range"), headers.get("if-range")
        if asked is not None and (condition is None or self._should_use_range(condition)):
            size = self.stat_result.st_size
            try:
                served = self._served_range(asked, size)
            except RangeNotSatisfiable:
                detail = f"the range {asked[:100]!r} starts past the file's {size} bytes"
                reply = error_response(scope["path"], 416, detail, {"Content-Range": f"bytes */{size}"})
                await reply(scope, receive, send)
                return
            kept = [(k, v) for k, v in scope["headers"] if k.lower() != b"range"]
            scope = dict(scope, headers=kept + ([(b"range", served.encode())] if served else []))
        await super().__call__(scope, receive, send)

    def _served_range(self, asked: str, size: int) -> str | None:
        """The Range to serve: the one asked, or its satisfiable ranges alone (§14.1.1: a set holding one is
        a 206 of those); None (the whole file) for one that cannot be read. RangeNotSatisfiable when none
        starts within the file."""
        try:
            self._parse_range_header(asked, size)
            return asked
        except MalformedRangeHeader:
            return None
        except RangeNotSatisfiable:
            ranges = self._parse_ranges(asked.partition("=")[2], size)
            within = [f"{start}-{end - 1}" for start, end in ranges if start < size]
            if not within:
                raise
            return self._served_range("bytes=" + ",".join(within), size)

    @asynccontextmanager
    async def _open_file(self):
        """The file opened in `__call__` (Starlette opens its path again to send the body)."""
        yield self._file


def _matches(if_none_match: str | None, etag: str) -> bool:
    """Weak comparison (§13.1.2): W/"x" matches "x"; `*` matches any file."""
    if if_none_match is None:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in if_none_match.split(",")]
    return "*" in tags or etag.removeprefix("W/") in tags
