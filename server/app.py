"""The FastAPI application: routes, the API-key and body-size guard, and the worker supervisor's lifetime."""

from __future__ import annotations

import contextlib
import threading

from fastapi import FastAPI

from server import api_docs, api_jobs, api_openai, api_ops, api_web, images, openai_errors, videos
from server.config import ServeConfig
from server.head import HeadAsGet
from server.jsonsafe import SafeJSONResponse
from server.middleware import GuardMiddleware, TrailingSlash, secured
from server.orphans import Sweeper
from server.retention import Retention
from server.services import Services
from server.store import open_store
from server.supervisor import Supervisor

# without a key: the page loads without one (its API calls need it), a probe's /health too
PUBLIC_PATHS = ("/health", *api_web.PAGE_FILES)


def create_app(config: ServeConfig, *, on_fatal=lambda: None) -> FastAPI:
    """`on_fatal` is called (from the supervisor thread) when the worker group cannot be kept alive."""
    # Requests wait briefly for another process's write lock, then answer 503; so does each supervisor call,
    # which then rides the lock out as an outage (retried up to --store-outage-grace), /ready saying so while
    # requests are refused (a 30 s wait had /ready say ready all along)
    store = open_store(config, busy_timeout=config.store_busy_timeout)
    supervisor = (
        Supervisor(config, open_store(config, busy_timeout=config.store_busy_timeout), on_fatal)
        if config.workers
        else None
    )
    # an API-only server sweeps what a supervisor's rounds would: jobs of worker boxes that vanished
    sweeper = (
        None
        if config.workers
        else Sweeper(config, open_store(config, busy_timeout=config.store_busy_timeout))
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        videos.sweep(store, config.videos_dir)
        # the first submit would otherwise wait seconds for `dit` to import
        threading.Thread(target=services.prompt_tokenizer, name="tokenizer", daemon=True).start()
        if supervisor is not None:
            supervisor.start()
        for thread in (sweeper, retention):
            if thread is not None:
                thread.start()
        yield
        for thread in (sweeper, retention):
            if thread is not None:
                thread.stop()
        if supervisor is not None:
            supervisor.stop(config.shutdown_grace)

    app = FastAPI(
        title="Ithaca",
        summary="Text-to-video generation with sequence-parallel attention",
        lifespan=lifespan,
        default_response_class=SafeJSONResponse,
        redirect_slashes=False,  # server.middleware.TrailingSlash
        docs_url=None,  # server.api_docs: the pages without a CDN
        redoc_url=None,
    )
    app.state.services = services = Services(config, store, supervisor)
    retention = Retention(services, config.keep_hours) if config.keep_hours else None
    for module in (api_ops, api_jobs, api_openai, api_web):
        app.include_router(module.router)
    openai_errors.install(app)
    api_docs.install(app)

    def openapi() -> dict:
        """FastAPI's document (built once) with the limits the workers published, as of this request."""
        info = services.worker_info()
        document = api_jobs.schema_with_limits(FastAPI.openapi(app), info)
        document = _encodings_of_fields(api_openai.schema_with_limits(document, info))
        return secured(document, PUBLIC_PATHS) if config.api_key else document

    app.openapi = openapi
    app.add_middleware(HeadAsGet)  # inside the guard: a HEAD needs the key a GET needs
    app.add_middleware(
        GuardMiddleware,
        api_key=config.api_key,
        max_body_bytes=config.max_body_bytes,
        upload_bytes=images.room(config.max_image_bytes),  # an image rides in the submit routes' bodies
        upload_paths=("/generate", "/v1/videos"),
        image_bytes=config.max_image_bytes,
        public_paths=PUBLIC_PATHS,
    )
    app.add_middleware(TrailingSlash)  # outermost: the guard's paths are the routes'
    return app


def _encodings_of_fields(document: dict) -> dict:
    """`document` without a form body's `encoding` of a field the limits took out of its schema (a text-to-
    video model's `image`, a catalogue-less server's `loras`): it named a field the body no longer had."""
    schemas = document["components"]["schemas"]
    for path in document["paths"].values():
        for operation in path.values():
            for media in operation.get("requestBody", {}).get("content", {}).values():
                schema = media.get("schema", {})
                schema = schemas.get(schema.get("$ref", "").rpartition("/")[2], schema)
                if "encoding" in media:
                    fields = schema.get("properties", {})
                    media["encoding"] = {
                        name: how for name, how in media["encoding"].items() if name in fields
                    }
    return document
