"""Pure ASGI middleware (cheaper than BaseHTTPMiddleware on the status-poll path): API key and body size, and
paths with a trailing slash."""

from __future__ import annotations

import hmac
import re
import time

from server import signed_links
from server.openai_errors import error_response


async def _send_json(scope, send, status: int, detail: str, headers: dict | None = None) -> None:
    await error_response(scope["path"], status, detail, headers)(scope, None, send)


_FORMS = (b"multipart/form-data", b"application/x-www-form-urlencoded")
# headers read once: given twice, this guard and the route could each take another one (a JSON body past
# the guard as a form, another key than the one checked)
_ONCE = (b"authorization", b"content-type", b"idempotency-key")


class _DataUrlRoom:
    """Whether a JSON body owes all it has past `plain` bytes to one string value starting `"data:`: the
    rest must fit in `plain` (the guard's total limit bounds the string). Fed the body as it grows; scans
    each byte once."""

    _START = re.compile(rb':\s*"data:')  # a value: inside a JSON string the quote would be escaped

    def __init__(self, plain: int):
        self.plain = plain
        self.start = self.end = None  # the data URL's quotes
        self.scanned = 0

    def fits(self, body: bytearray) -> bool:
        if len(body) <= self.plain:
            return True
        if self.start is None:
            match = self._START.search(body, 0, self.plain + 16)
            if match is None:
                return False
            self.start = self.scanned = match.end() - len(b'"data:')
        if self.end is None:
            end = body.find(b'"', self.scanned + 1)
            if end == -1:
                self.scanned = len(body) - 1
                return True
            self.end = end
        return len(body) - (self.end + 1 - self.start) <= self.plain


def secured(document: dict, public_paths) -> dict:
    """The OpenAPI document (a copy of its own: `schema_with_limits`) saying what the guard asks: a bearer key
    on every operation but those of `public_paths`."""
    schemes = document.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes["apiKey"] = {"type": "http", "scheme": "bearer", "description": "--api-key (ITHACA_API_KEY)"}
    document["security"] = [{"apiKey": []}]
    for path in public_paths:
        for operation in document["paths"].get(path, {}).values():
            operation["security"] = []
    return document


class TrailingSlash:
    """`/jobs/` is served as `/jobs` (no route's path ends in a slash). Starlette answered it a 307 to an
    absolute URL made of the Host header: behind a proxy that ends TLS, `http://` and the inner host's name
    (a browser's page then blocked the request); from a client, any host it named."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            raw = scope.get("raw_path")
            scope = scope | {"path": path.rstrip("/") or "/"}
            if raw is not None:
                scope["raw_path"] = raw.rstrip(b"/") or b"/"
        await self.app(scope, receive, send)


class GuardMiddleware:
    """Every route but `public_paths` (/health, the web page's files) needs `Authorization: Bearer <key>`
    when a key is set, or a signed link's query (server.signed_links) for a job's video or preview; larger
    bodies get 413.
    A POST to one of `upload_paths` (the submit routes, which may carry an image) may be `upload_bytes`
    larger, for the image alone: a form's parser bounds each part (api_jobs.form_fields), any other body
    (JSON) is read here and may pass `max_body_bytes` only by one data URL string (`_DataUrlRoom`), so a
    large body without an image is refused after `max_body_bytes`, never read or parsed whole.

    A body without Content-Length is read here up to the limit and handed on, so the app never sees an
    oversized body whatever the client declares.
    """

    def __init__(
        self,
        app,
        *,
        api_key: str | None,
        max_body_bytes: int,
        upload_bytes: int = 0,
        upload_paths=(),
        image_bytes: int = 0,
        public_paths=("/health",),
    ):
        self.app, self.max_body_bytes, self.public_paths = app, max_body_bytes, frozenset(public_paths)
        self.upload_bytes, self.upload_paths = upload_bytes, frozenset(upload_paths)
        self.image_bytes = image_bytes  # --max-image-bytes, said in an upload's 413
        self.expected = api_key.encode() if api_key else None

    def _linked(self, scope) -> bool:
        query = scope.get("query_string", b"")
        return signed_links.opens(self.expected, scope["method"], scope["path"], query, time.time())

    def _upload(self, scope) -> bool:
        return scope["method"] == "POST" and scope["path"] in self.upload_paths

    def _limit(self, scope) -> int:
        return self.max_body_bytes + (self.upload_bytes if self._upload(scope) else 0)

    def _too_large(self, scope, limit: int) -> str:
        """An image far past its limit makes the body too large before the image is read: said so (it read
        as the body's size alone, naming neither the image nor its limit)."""
        said = f"request body is larger than {limit} bytes"
        if self._upload(scope) and self.image_bytes:
            said += f"; an image may be at most {self.image_bytes} bytes (--max-image-bytes)"
        return said

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        names = [name for name, _ in scope["headers"]]
        for name in _ONCE:
            if names.count(name) > 1:
                header = name.decode().title()
                return await _send_json(
                    scope, send, 400, f"{header} is given {names.count(name)} times; give it once"
                )
        headers = dict(scope["headers"])
        if self.expected is not None and scope["path"] not in self.public_paths and not self._linked(scope):
            scheme, _, key = headers.get(b"authorization", b"").partition(b" ")
            # the scheme's name is case-insensitive (RFC 9110 §11.1): "bearer KEY" is as good
            if scheme.lower() != b"bearer" or not hmac.compare_digest(key.lstrip(b" "), self.expected):
                return await _send_json(
                    scope,
                    send,
                    401,
                    "missing or wrong API key (Authorization: Bearer <key>)",
                    {"WWW-Authenticate": "Bearer"},
                )
        limit = self._limit(scope)
        length = headers.get(b"content-length")
        if length is not None and not length.isdigit():
            return await _send_json(scope, send, 400, "invalid Content-Length")
        if length is not None and int(length) > limit:
            return await _send_json(scope, send, 413, self._too_large(scope, limit))
        form = headers.get(b"content-type", b"").split(b";")[0].strip().lower() in _FORMS
        plain = self.max_body_bytes
        room = None if form or limit == plain else _DataUrlRoom(plain)
        if length is not None and (room is None or int(length) <= plain):
            return await self.app(scope, receive, send)
        if length is None and scope["method"] in ("GET", "HEAD", "DELETE"):
            return await self.app(scope, receive, send)
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message.get("body", b"")
            if len(body) > limit:
                return await _send_json(scope, send, 413, self._too_large(scope, limit))
            if room is not None and not room.fits(body):
                detail = (
                    f"request body is larger than {plain} bytes; only an image, one data URL "
                    f"(data:image/png;base64,...), may take it up to {limit}"
                )
                return await _send_json(scope, send, 413, detail)
            if not message.get("more_body"):
                break
        replay = [{"type": "http.request", "body": bytes(body), "more_body": False}]

        async def replay_receive():
            return replay.pop() if replay else await receive()

        return await self.app(scope, replay_receive, send)
