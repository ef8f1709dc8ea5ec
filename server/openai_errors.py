"""Every error reply, in the shape of its route: under /v1 OpenAI's `{"error": {"message", "type", "param",
"code"}}`, so the official SDK shows the real reason (it reads `error.message`); elsewhere FastAPI's
`{"detail": ...}`. The handlers never raise: replies render through `jsonsafe` (a client's lone surrogate or
NaN echoed back stays valid JSON), a locked store is a 503 with Retry-After, and anything unexpected is a
500 in the same shape rather than a bare text page."""

from __future__ import annotations

import logging
import sqlite3

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from server.jsonsafe import SafeJSONResponse, shown
from server.store import StoreBusy

log = logging.getLogger("ithaca.server")
PREFIX = "/v1/"
_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}
_REASONS = {
    400: "The request cannot be read (body, Content-Length or a header)",
    401: "Missing or wrong API key (Authorization: Bearer <key>)",
    404: "No such job, or no video for it yet",
    409: "Conflict: the job is finished, or the Idempotency-Key was used with another body",
    413: "The request body is larger than --max-body-bytes",
    415: "Unsupported Content-Type",
    416: "The Range starts past the end of the file",
    422: "A field is invalid; the reply names it and the allowed values",
    429: "The queue is full; retry after Retry-After seconds",
    503: "The job store is locked, busy or unreachable (the message says); retry after Retry-After seconds",
}
ECHO_CHARS = 100  # of a client's value quoted back in a validation error
STORE_BUSY = "the job store is busy (another process holds its write lock); retry shortly"


class NativeError(BaseModel):
    detail: str | list[dict]


class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    error: OpenAIErrorBody


def responses(*codes: int, openai: bool = False) -> dict:
    """The error replies a route may give, for the OpenAPI document."""
    model = OpenAIError if openai else NativeError
    return {code: {"model": model, "description": _REASONS[code]} for code in codes}


def error_body(status: int, message: str, param: str | None = None) -> dict:
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _from_detail(detail) -> tuple[str, str | None]:
    """FastAPI detail (a string, or validation errors with `loc`/`msg`) → (message, first field named)."""
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        param = next((str(d["loc"][-1]) for d in detail if d.get("loc")), None)
        return "; ".join(str(d.get("msg", d)) for d in detail), param
    return str(detail), None


def error_response(path: str, status: int, detail, headers: dict | None = None) -> SafeJSONResponse:
    if path.startswith(PREFIX):
        body = error_body(status, *_from_detail(detail))
    else:
        body = {"detail": detail}
    return SafeJSONResponse(body, status, headers=headers)


def _validation_errors(errors) -> list[dict]:
    """pydantic's errors without what cannot or should not travel back: containers as `input` (a whole
    body), `ctx` (may hold exception objects); a long string input is cut short."""
    out = []
    for e in errors:
        item = {"type": e.get("type"), "loc": list(e.get("loc", ())), "msg": e.get("msg")}
        value = e.get("input")
        if isinstance(value, str | int | float | bool):
            item["input"] = value[:ECHO_CHARS] if isinstance(value, str) else value
        out.append(item)
    return out


def methods_at(app, scope) -> set[str]:
    """Every method some route of `app` declares on the path of `scope`."""
    methods = set()
    for route in _routes(app.router.routes):
        if route.matches(scope)[0] != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return methods


def _allowed_methods(request: Request) -> str:
    """What the path takes: its routes' methods, and HEAD wherever GET is (server.head)."""
    methods = methods_at(request.app, request.scope)
    return ", ".join(sorted(methods | {"HEAD"} if "GET" in methods else methods))


def _routes(routes):
    for route in routes:
        router = getattr(route, "original_router", None)  # FastAPI's include_router keeps the router whole
        yield from (route,) if router is None else _routes(router.routes)


def install(app: FastAPI) -> None:
    def busy(request: Request, message: str = STORE_BUSY) -> SafeJSONResponse:
        return error_response(request.scope["path"], 503, message, {"Retry-After": "1"})

    def internal(request: Request) -> SafeJSONResponse:
        return error_response(request.scope["path"], 500, "internal server error")

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        headers = exc.headers
        detail = exc.detail
        if exc.status_code == 405:  # Starlette's Allow names the first route of the path only
            headers = (headers or {}) | {"Allow": _allowed_methods(request)}
        elif exc.status_code == 404 and detail == "Not Found":  # no route: an SDK method this server lacks
            path = shown(request.scope["path"])
            method = "GET" if request.method == "HEAD" else request.method  # a HEAD's headers are its GET's
            detail = f"this server has no {method} {path}; /openapi.json lists its routes"
        return error_response(request.scope["path"], exc.status_code, detail, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return error_response(request.scope["path"], 422, _validation_errors(exc.errors()))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect):  # no one reads it; no traceback in the log
        return error_response(request.scope["path"], 400, "the client went away before its body ended")

    @app.exception_handler(StoreBusy)
    async def _busy(request: Request, exc: StoreBusy):
        return busy(request, str(exc))  # locked, busy or unreachable, and why

    @app.exception_handler(sqlite3.OperationalError)
    async def _sqlite(request: Request, exc: sqlite3.OperationalError):
        # a store without a short busy timeout reports the same condition this way
        if "locked" in str(exc) or "busy" in str(exc):
            return busy(request)
        log.error("%s %s failed", request.method, request.scope["path"], exc_info=exc)
        return internal(request)

    @app.exception_handler(Exception)
    async def _last_resort(request: Request, exc: Exception):
        return internal(request)  # Starlette re-raises `exc` after this reply, so the server logs it
