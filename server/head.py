"""HEAD wherever GET is (RFC 9110 §9.3.2: a server that answers GET answers HEAD; monitors and proxies probe
with it). A route without a HEAD of its own runs as its GET and the client gets the status and headers alone
(Content-Length the GET's); an event stream ends at its headers. Pure ASGI, as `server.middleware`."""

from __future__ import annotations

from server.openai_errors import methods_at


class _Ended(Exception):
    """The headers went out and the body is not wanted: stops a streaming route."""


class HeadAsGet:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)
        methods = methods_at(scope["app"], scope | {"method": "GET"})
        if "HEAD" in methods or "GET" not in methods:  # its own HEAD, or none (404, 405)
            return await self.app(scope, receive, send)
        ended = False

        async def headers_only(message):
            nonlocal ended
            if message["type"] != "http.response.body":
                return await send(message)
            if not ended:
                ended = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            if message.get("more_body"):
                raise _Ended

        try:
            await self.app(scope | {"method": "GET"}, receive, headers_only)
        except _Ended:
            pass
