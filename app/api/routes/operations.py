"""Operations: GET /queues, /workers, /metrics, /healthz."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from qforge.api.common import ERRORS
from qforge.api.deps import ReadConn
from qforge.api.errors import ApiError
from qforge.api.models import Health, QueueList, WorkerList
from qforge.projections.stats import database_ok, queue_stats
from qforge.projections import serving
from qforge.projections.workers import live_workers

router = APIRouter(tags=["operations"])
health_router = APIRouter(tags=["operations"])


@router.get("/queues", response_model=QueueList, responses=ERRORS)
def queues(conn: ReadConn, request: Request) -> dict:
    """Per queue: job counts by status, the age of the oldest due pending job, how many live
    workers serve it, and warnings when due jobs wait for a worker that is not there."""
    stats = queue_stats(conn)
    serving.queue_warnings(conn, stats, request.app.state.resources.settings.stale_seconds)
    return {"items": stats, "next": None}


@router.get("/workers", response_model=WorkerList, responses=ERRORS)
def workers(conn: ReadConn, request: Request) -> dict:
    """Live workers: those that heartbeated within QFORGE_STALE_SECONDS."""
    stale_seconds = request.app.state.resources.settings.stale_seconds
    return {"items": live_workers(conn, stale_seconds), "next": None}


@router.get("/metrics", response_class=Response, responses={
    200: {"description": "Prometheus text exposition", "content": {"text/plain": {}}}, **ERRORS})
def metrics(request: Request) -> Response:
    """Queue depth, log counters (claims, completions, failures, dead letters), claim latency."""
    return Response(generate_latest(request.app.state.metrics), media_type=CONTENT_TYPE_LATEST)


@health_router.get("/healthz", response_model=Health,
                   responses={503: ERRORS[503]})
def healthz(request: Request) -> dict:
    """ok when the database answers (no token needed)."""
    try:
        with request.app.state.resources.pool.connection() as conn:
            database_ok(conn)
    except Exception as exc:  # any failure to reach the database is "not healthy"
        raise ApiError(503, "unavailable", f"the database does not answer: {exc}".splitlines()[0],
                       headers={"Retry-After": "1"}) from None
    return {"status": "ok"}
