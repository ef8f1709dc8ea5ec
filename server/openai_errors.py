"""Errors under /v1 in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, so the official SDK
shows the real reason (it reads `error.message`); the native API keeps FastAPI's `{"detail": ...}`."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

PREFIX = "/v1/"
_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}


def error_body(status: int, message: str, param: str | None = None) -> dict:
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _from_detail(detail) -> tuple[str, str | None]:
    """FastAPI detail (a string, or validation errors with `loc`/`msg`) → (message, first field named)."""
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        param = next((str(d["loc"][-1]) for d in detail if d.get("loc")), None)
        return "; ".join(str(d.get("msg", d)) for d in detail), param
    return str(detail), None


def install(app: FastAPI) -> None:
    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        if not request.url.path.startswith(PREFIX):
            return await http_exception_handler(request, exc)
        message, param = _from_detail(exc.detail)
        return JSONResponse(error_body(exc.status_code, message, param), exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        if not request.url.path.startswith(PREFIX):
            return await request_validation_exception_handler(request, exc)
        message, param = _from_detail(exc.errors())
        return JSONResponse(error_body(422, message, param), 422)
