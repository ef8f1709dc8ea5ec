"""Pure ASGI middleware (cheaper than BaseHTTPMiddleware on the status-poll path): API key and body size."""

from __future__ import annotations

import hmac

from server.openai_errors import error_response


async def _send_json(scope, send, status: int, detail: str, headers: dict | None = None) -> None:
    await error_response(scope["path"], status, detail, headers)(scope, None, send)


class GuardMiddleware:
    """Every route but `public_paths` (/health, the web page's files) needs `Authorization: Bearer <key>`
    when a key is set; larger bodies get 413.
    A POST to one of `upload_paths` (the submit routes, which may carry an image) may be `upload_bytes`
    larger.

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
        public_paths=("/health",),
    ):
        self.app, self.max_body_bytes, self.public_paths = app, max_body_bytes, frozenset(public_paths)
        self.upload_bytes, self.upload_paths = upload_bytes, frozenset(upload_paths)
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    def _limit(self, scope) -> int:
        upload = scope["method"] == "POST" and scope["path"].rstrip("/") in self.upload_paths
        return self.max_body_bytes + (self.upload_bytes if upload else 0)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.expected is not None and scope["path"] not in self.public_paths:
            if not hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
                return await _send_json(
                    scope,
                    send,
                    401,
                    "missing or wrong API key (Authorization: Bearer <key>)",
                    {"WWW-Authenticate": "Bearer"},
                )
        limit = self._limit(scope)
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                return await _send_json(scope, send, 400, "invalid Content-Length")
            if int(length) > limit:
                return await _send_json(scope, send, 413, f"request body is larger than {limit} bytes")
            return await self.app(scope, receive, send)
        if scope["method"] in ("GET", "HEAD", "DELETE"):
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                return await _send_json(scope, send, 413, f"request body is larger than {limit} bytes")
            if not message.get("more_body"):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay_receive():
            return replay.pop() if replay else await receive()

        return await self.app(scope, replay_receive, send)
