"""GET /stats/recent: the last 15 minutes for the dashboard's charts."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from qforge.api.common import ERRORS
from qforge.api.deps import Conn
from qforge.projections.recent import RecentStats

router = APIRouter(tags=["operations"])


class Throughput(BaseModel):
    t: int = Field(description="bucket start, Unix seconds")
    succeeded: float = Field(description="attempts per second")
    failed: float
    dead: float
    cancelled: float


class Latency(BaseModel):
    t: int
    count: int = Field(description="jobs started in the bucket")
    p50: float | None = Field(description="enqueue-to-start seconds (upper edge of its log-scale bin)")
    p99: float | None


class Depth(BaseModel):
    t: float
    queues: dict[str, int] = Field(description="pending jobs per queue")


class RecentView(BaseModel):
    now: float
    window_seconds: int
    bucket_seconds: int
    throughput: list[Throughput]
    latency: list[Latency]
    depth: list[Depth] = Field(description="sampled when the stats are asked for")


@router.get("/stats/recent", response_model=RecentView, responses=ERRORS)
def recent(conn: Conn, request: Request) -> dict:
    """Jobs finished per second by outcome, enqueue-to-start p50/p99 and pending jobs per queue
    over the last 15 minutes, in 10-second buckets (folded from the log by this API process)."""
    state = request.app.state
    if getattr(state, "recent", None) is None:
        state.recent = RecentStats()
    return state.recent.snapshot(conn)
