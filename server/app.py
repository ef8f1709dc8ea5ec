"""The FastAPI application: routes, the API-key and body-size guard, and the worker supervisor's lifetime."""

from __future__ import annotations

import contextlib
import logging

from fastapi import FastAPI

from server import api_jobs, api_openai, api_ops, openai_errors
from server.config import ServeConfig
from server.middleware import GuardMiddleware
from server.services import Services
from server.store import JobStore
from server.supervisor import Supervisor

log = logging.getLogger("ithaca.server")


def create_app(config: ServeConfig, *, on_fatal=lambda: None) -> FastAPI:
    """`on_fatal` is called (from the supervisor thread) when the worker group cannot be kept alive."""
    store = JobStore(config.db_path)
    supervisor = Supervisor(config, store, on_fatal) if config.workers else None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if supervisor is not None:
            supervisor.start()
        yield
        if supervisor is not None:
            log.info(
                "shutting down: no new jobs; the running job has %.0f s to finish", config.shutdown_grace
            )
            supervisor.stop(config.shutdown_grace)

    app = FastAPI(
        title="Ithaca", summary="Text-to-video generation with sequence-parallel attention", lifespan=lifespan
    )
    app.state.services = Services(config, store, supervisor)
    for module in (api_ops, api_jobs, api_openai):
        app.include_router(module.router)
    openai_errors.install(app)
    app.add_middleware(GuardMiddleware, api_key=config.api_key, max_body_bytes=config.max_body_bytes)
    return app
