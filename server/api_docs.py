"""/docs (Swagger UI) and /redoc from this box's own files: FastAPI's pages load their scripts from a CDN,
a blank page on a box without the internet (most GPU boxes); the fastapi-offline package ships the files."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/assets"


def install(app: FastAPI) -> None:
    """`app` is built with docs_url=None and redoc_url=None (FastAPI's own pages, which reach the CDN)."""
    app.mount(ASSETS, StaticFiles(directory=Path(fastapi_offline.__file__).parent / "static"), name="docs")

    def where(request: Request) -> tuple[str, str]:
        """The document's URL and the files' folder (under a proxy's prefix, where one serves us)."""
        base = request.scope.get("root_path", "")
        return base + app.openapi_url, base + ASSETS

    @app.get("/docs", include_in_schema=False)
    def swagger(request: Request) -> HTMLResponse:
        document, files = where(request)
        return get_swagger_ui_html(
            openapi_url=document,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{files}/swagger-ui-bundle.js",
            swagger_css_url=f"{files}/swagger-ui.css",
            swagger_favicon_url=f"{files}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        document, files = where(request)
        return get_redoc_html(
            openapi_url=document,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{files}/redoc.standalone.js",
            redoc_favicon_url=f"{files}/favicon.png",
            with_google_fonts=False,
        )
