"""/schedules: cron schedules that start a job or a stored definition's workflow on each tick."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from qforge.api.auth import Actor
from qforge.api.common import ERRORS
from qforge.api.deps import Conn
from qforge.api.errors import ApiError
from qforge.api.models import EventHistory
from qforge.commands import schedules as commands
from qforge.commands.schedules import CatchUp, ScheduleSpec
from qforge.commands.specs import NAME_PATTERN, JobSpec
from qforge.events import store

router = APIRouter(tags=["schedules"])

ScheduleName = Path(pattern=NAME_PATTERN)


class ScheduleView(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: UUID
    name: str
    cron: str
    timezone: str
    job: dict[str, Any] | None = None
    definition: str | None = None
    version: int | None = Field(default=None, description="the definition's pinned version (null: the latest)")
    inputs: dict[str, Any] | None = None
    catch_up: str
    paused: bool
    next_fire_at: datetime | None = Field(description="the next tick (null while paused)")
    last_tick: datetime | None = None
    last_execution_id: UUID | None = Field(default=None, description="the job or workflow of the last tick")
    fired: int
    skipped: int = Field(description="missed ticks that catch_up did not fire")
    error: str | None = Field(default=None, description="why its ticks cannot fire now (e.g. its "
                                                        "definition does not exist); null when they can")
    created_at: datetime
    updated_at: datetime


class ScheduleList(BaseModel):
    items: list[ScheduleView]
    next: str | None = None


class SchedulePatch(BaseModel):
    """PATCH /schedules/{name}: `{"paused"?}` and any field of POST but the name."""

    model_config = ConfigDict(extra="forbid")

    paused: StrictBool | None = None
    cron: str | None = None
    timezone: str | None = None
    job: JobSpec | None = None
    definition: str | None = None
    version: StrictInt | None = Field(default=None, ge=1, le=2**31 - 1,
                                      description="pin a version of the definition; null: the latest")
    inputs: dict[str, Any] | None = None
    catch_up: CatchUp | None = None


def _schedule(conn, name: str) -> dict:
    schedule = commands.get_schedule(conn, name)
    if schedule is None:
        raise ApiError(404, "not_found", f"schedule {name} not found")
    return schedule


@router.post("/schedules", status_code=201, response_model=ScheduleView, responses=ERRORS)
def create_schedule(body: ScheduleSpec, conn: Conn, actor: Actor) -> dict:
    """Create a schedule (409 when the name exists). Cron: five fields, or six with the seconds first."""
    return commands.create_schedule(conn, body, actor=actor)


@router.get("/schedules", response_model=ScheduleList, responses=ERRORS)
def list_schedules(conn: Conn) -> dict:
    """Every schedule with its next fire time."""
    return {"items": commands.list_schedules(conn), "next": None}


@router.get("/schedules/{name}", response_model=ScheduleView, responses=ERRORS)
def get_schedule(conn: Conn, name: str = ScheduleName) -> dict:
    return _schedule(conn, name)


@router.get("/schedules/{name}/events", response_model=EventHistory, responses=ERRORS)
def schedule_events(conn: Conn, name: str = ScheduleName) -> dict:
    """The schedule's history: created, changed, paused, every tick fired or skipped."""
    schedule = _schedule(conn, name)
    return {"events": [e.model_dump(mode="json") for e in store.read_stream(conn, schedule["id"])]}


@router.patch("/schedules/{name}", response_model=ScheduleView, responses=ERRORS)
def update_schedule(body: SchedulePatch, conn: Conn, actor: Actor, name: str = ScheduleName) -> dict:
    """Pause or resume (`{"paused": bool}`) and change any field; ticks missed while paused do not fire."""
    changes = body.model_dump(mode="json", exclude_unset=True)
    return commands.update_schedule(conn, name, changes, actor=actor)


@router.delete("/schedules/{name}", status_code=204, response_class=Response, responses=ERRORS)
def delete_schedule(conn: Conn, actor: Actor, name: str = ScheduleName) -> Response:
    commands.delete_schedule(conn, name, actor=actor)
    return Response(status_code=204)
