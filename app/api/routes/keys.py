"""/keys: a concurrency or fairness key's limits, set centrally (events of the key's stream), and what runs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from qforge.api.auth import Actor
from qforge.api.common import ERRORS, limit_query
from qforge.api.deps import Conn
from qforge.api.errors import ApiError
from qforge.api.models import EventHistory, KeyList, KeyView
from qforge.commands import keys as commands
from qforge.events import store

router = APIRouter(tags=["operations"])

KeyName = Annotated[str, Path(min_length=1, max_length=commands.KEY_MAX_LENGTH,
                              description="a job's concurrency_key or fairness_key")]


@router.put("/keys/{name}", response_model=KeyView, responses=ERRORS)
def put_key(name: KeyName, body: commands.KeySettingsSpec, conn: Conn, actor: Actor) -> dict:
    """`{"concurrency_limit"?: int | null, "weight"?: int, "rate_per_second"?: float | null,
    "burst"?: int}`; fields left out keep their value, null clears. concurrency_limit replaces the
    limit of every job with this concurrency_key (a job's own applies only while the key has none);
    weight is the turns a fairness_key takes per rotation; rate_per_second / burst bound how fast
    the key's jobs start over all queues and workers. Each change is a KeyConfigured event."""
    commands.configure_key(conn, name, body, actor=actor)
    view = commands.get_key(conn, name)
    assert view is not None
    return view


@router.get("/keys", response_model=KeyList, responses=ERRORS)
def list_keys(conn: Conn, limit: limit_query = 100,
              cursor: Annotated[str | None, Query(max_length=commands.KEY_MAX_LENGTH)] = None) -> dict:
    """Configured keys and the keys jobs used, by name: settings, the limit in force, running counts."""
    items = commands.list_keys(conn, after=cursor, limit=limit + 1)
    more = len(items) > limit
    items = items[:limit]
    return {"items": items, "next": items[-1]["key"] if more else None}


@router.get("/keys/{name}", response_model=KeyView, responses=ERRORS)
def get_key(name: KeyName, conn: Conn) -> dict:
    found = commands.get_key(conn, name)
    if found is None:
        raise ApiError(404, "not_found", f"key {name} not found: never configured nor used by a job")
    return found


@router.get("/keys/{name}/events", response_model=EventHistory, responses=ERRORS)
def key_events(name: KeyName, conn: Conn) -> dict:
    """The key's history: every KeyConfigured, oldest first (404 for a key never configured)."""
    events = store.read_stream(conn, commands.key_stream_id(name))
    if not events:
        raise ApiError(404, "not_found", f"key {name} was never configured")
    return {"events": [e.model_dump(mode="json") for e in events]}
