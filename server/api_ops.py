"""Operations routes: /health (process alive; "degraded" with the reason while the supervisor cannot reach
its job store), /ready (worker group loaded and answering, and the store reachable), /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from server import metrics
from server.api_jobs import svc
from server.openai_errors import responses
from server.replies import Health, Ready, reply
from server.store import StoreBusy

router = APIRouter()


@router.get("/health", responses=reply(Health))
@router.head("/health", responses=reply(Health))
async def health(request: Request):  # no store: it answers while another process holds the store's lock
    supervisor = svc(request).supervisor
    reason = supervisor.degraded() if supervisor else None
    return {"status": "ok"} if reason is None else {"status": "degraded", "reason": reason}


_READY = {"responses": reply(Ready) | reply(Ready, 503, "Not ready (the same body)") | responses(401)}


@router.get("/ready", **_READY)
@router.head("/ready", **_READY)  # a load balancer's probe: the status alone
def ready(request: Request):
    services = svc(request)
    ok = services.ready()
    supervisor = services.supervisor
    try:
        info = services.worker_info()
    except StoreBusy:  # the reason below says why
        info = {}
    body = {
        "ready": ok,
        "group": supervisor.group_id if supervisor else None,
        "restarts": supervisor.restarts if supervisor else 0,
        "fatal": supervisor.fatal if supervisor else None,
        "reason": None if ok else _unready_reason(supervisor),
        # the exchange the workers use and, with --comm auto, the start-up probe's rows (ms None: ruled out)
        "comm": info.get("comm"),
        # the sizes --warmup generated before the group reported ready, each with its seconds
        "warmup": info.get("warmup"),
    }
    return JSONResponse(body, status_code=200 if ok else 503)


def _unready_reason(supervisor) -> str:
    return supervisor.unready() if supervisor else "no worker group of this job store serves (--no-workers)"


@router.get("/metrics", response_class=PlainTextResponse, responses=responses(401))
def prometheus(request: Request):
    """Answered through a store outage too (a scrape that failed would read as a server down): the series
    the store holds are left out then, and `ithaca_store_up` says why."""
    services = svc(request)
    try:
        counts, counters, info = services.store.counts(), services.store.counters(), services.worker_info()
        ready = services.ready()
    except StoreBusy:
        counts = counters = None
        info, ready = {}, False
    text = metrics.render(
        counts=counts,
        counters=counters,
        restarts=services.supervisor.restarts if services.supervisor else 0,
        ready=ready,
        comm=info.get("comm"),
    )
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")
