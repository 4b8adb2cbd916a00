"""PUT /queues/{name}: pause, resume and rate-limit a queue (GET /queues shows the settings)."""

from __future__ import annotations

from fastapi import APIRouter, Path
from pydantic import BaseModel

from qforge.api.auth import Actor
from qforge.api.common import ERRORS
from qforge.api.deps import Conn
from qforge.commands.queues import QueueSettingsSpec, configure_queue
from qforge.commands.specs import NAME_PATTERN

router = APIRouter(tags=["operations"])


class QueueSettingsView(BaseModel):
    queue: str
    paused: bool
    rate_per_second: float | None
    burst: int | None


@router.put("/queues/{name}", response_model=QueueSettingsView, responses=ERRORS)
def put_queue(body: QueueSettingsSpec, conn: Conn, actor: Actor, name: str = Path(pattern=NAME_PATTERN)) -> dict:
    """`{"rate_per_second"?: float | null, "burst"?: int, "paused"?: bool}`: fields left out keep
    their value. A paused queue is not claimed (running jobs finish); rate_per_second bounds how
    fast its claims start over all workers (a token bucket in PostgreSQL)."""
    settings = configure_queue(conn, name, body, actor=actor)
    return settings.__dict__
