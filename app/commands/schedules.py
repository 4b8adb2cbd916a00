"""Schedules: create, change, pause, delete, and fire each tick exactly once (the monitor's leader).

A tick fires in one transaction under the schedule's row lock: the job (or
workflow) it starts, with the idempotency key `schedule:<name>:<tick>`, and
the ScheduleFired event that moves next_fire_at on. Whoever fires, however
often a monitor dies or PostgreSQL restarts, a tick is either wholly fired or
not at all, and the next firer sees it fired. After downtime, ticks older than
the misfire grace are "missed": catch_up says which of them still fire.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Literal
from uuid import UUID

import logging

import psycopg
from psycopg.rows import dict_row
from pydantic import Field, StrictBool, StrictInt, field_validator, model_validator
from pydantic_core import PydanticCustomError

from qforge.commands import cron
from qforge.workflows import definitions
from qforge.workflows.engine import start_definition
from qforge.commands.enqueue import enqueue
from qforge.commands.errors import CommandError, Conflict, Invalid, NotFound
from qforge.commands.specs import NAME_PATTERN, JobSpec, Storable
from qforge.events import store
from qforge.events import types as ev
from qforge.events.ids import new_ids
from qforge.events.types import NewEvent
from qforge import tracing
from qforge.sql import q
from qforge.warn_once import OncePerInterval

log = logging.getLogger("qforge.schedules")

CatchUp = Literal["none", "latest", "all"]


def refuse(problem: str | None, value: Any) -> Any:
    """`value`, or the problem as a validation error of the field (in its own words: a
    PydanticCustomError carries no "Value error, " prefix)."""
    if problem:
        raise PydanticCustomError("invalid", problem)
    return value


class ScheduleSpec(Storable):
    """POST /schedules: `{"name", "cron", "timezone"?, "job": {a POST /jobs body} |
    "definition": name, "version"?, "inputs"?, "catch_up"?: "none" | "latest" | "all", "paused"?}`
    (`version` pins the definition's version every tick runs; without it a tick runs the latest)."""

    name: str = Field(pattern=NAME_PATTERN)
    cron: str = Field(min_length=1, max_length=200,
                      description="five fields, or six with the seconds first (*/2 * * * * * = every 2 s)")
    timezone: str = Field(default="UTC", max_length=100)
    job: JobSpec | None = None
    definition: str | None = Field(default=None, min_length=1, max_length=200)
    version: StrictInt | None = Field(default=None, ge=1, le=2**31 - 1,
                                description="the definition's version every tick runs (default: the latest)")
    inputs: dict[str, Any] | None = None
    catch_up: CatchUp = Field(default="latest", description="which ticks missed during downtime fire: none, "
                                                             "the latest one, or all")
    paused: StrictBool = False

    @field_validator("cron")
    @classmethod
    def _cron(cls, expression: str) -> str:
        return refuse(cron.check(expression), expression)

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, zone: str) -> str:
        return refuse(cron.check_timezone(zone), zone)

    @model_validator(mode="after")
    def _consistent(self) -> "ScheduleSpec":
        problems = []
        if (self.job is None) == (self.definition is None):
            problems.append("give either job or definition")
        if self.inputs is not None and self.definition is None:
            problems.append("inputs go with a definition (a job has its payload)")
        if self.version is not None and self.definition is None:
            problems.append("version goes with a definition (it pins the definition's version)")
        if self.job is not None:
            if self.job.idempotency_key is not None:
                problems.append("job.idempotency_key is set by the schedule (its name and the tick)")
            if self.job.run_at is not None:
                problems.append("job.run_at: a scheduled job runs at its tick (delay_seconds is allowed)")
        refuse("; ".join(problems) or None, self)
        return self

    def stored(self) -> dict[str, Any]:
        """The spec as events carry it (name and paused have events of their own)."""
        return self.model_dump(mode="json", exclude={"name", "paused"}, exclude_none=True,
                               exclude_defaults=False)


def _spec_of(row: dict[str, Any]) -> ScheduleSpec:
    return ScheduleSpec.model_validate({**row["spec"], "name": row["name"], "paused": row["paused"]})


def _now(now: datetime | None) -> datetime:
    return now or datetime.now(timezone.utc)


def _require_definition(conn, spec: ScheduleSpec) -> None:
    """A schedule names a stored definition that exists (as a sub-workflow step must), or it
    would be refused at every tick instead of once, here; and a pinned version of it (versions
    are never removed, so it exists for good)."""
    if spec.definition is None:
        return
    if definitions.get_definition(conn, spec.definition) is None:
        message = f"definition: no stored definition is named '{spec.definition}' (PUT /definitions/{{name}} first)"
        raise Invalid(message, [{"field": "definition", "message": message}])
    if spec.version is not None and definitions.get_definition(conn, spec.definition, spec.version) is None:
        raise Invalid(f"version: definition {spec.definition} has no version {spec.version}",
                      [{"field": "version", "message": f"definition {spec.definition} has no version {spec.version}"}])


def create_schedule(conn, spec: ScheduleSpec, *, actor: str = "api", now: datetime | None = None) -> dict:
    _require_definition(conn, spec)
    at = _now(now)
    [stream] = new_ids(1)
    with tracing.span("qforge.schedule.create", producer=False, schedule=spec.name) as traced:
        pass
    events: list[ev.EventData] = [ev.ScheduleCreated(name=spec.name, spec=spec.stored(),
                                                     next_at=cron.next_after(spec.cron, spec.timezone, at),
                                                     trace=traced.carrier)]
    if spec.paused:
        events.append(ev.SchedulePaused())
    try:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            if cur.execute(q("schedule_lock"), {"name": spec.name}).fetchone() is not None:
                raise Conflict(f"schedule {spec.name} exists (PATCH changes it)")
            store.append(conn, [NewEvent(stream_id=stream, version=n, data=data)
                               for n, data in enumerate(events, start=1)], actor=actor, now=now)
    except psycopg.errors.UniqueViolation:  # created by someone else at the same moment
        raise Conflict(f"schedule {spec.name} exists (PATCH changes it)") from None
    return get_schedule(conn, spec.name)


def update_schedule(conn, name: str, changes: dict[str, Any], *, actor: str = "api",
                    now: datetime | None = None) -> dict:
    """PATCH: `changes` holds the fields given (`paused` and the fields of POST but name)."""
    at = _now(now)
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(q("schedule_lock"), {"name": name}).fetchone()
        if row is None:
            raise NotFound(f"schedule {name} not found")
        current = _spec_of(row)
        merged = {**current.model_dump(mode="json", exclude_none=True), **changes}
        if "job" in changes and changes["job"] is not None:
            merged.pop("definition", None)
            merged.pop("inputs", None)
            merged.pop("version", None)
        if "definition" in changes and changes["definition"] is not None:
            merged.pop("job", None)
            if "version" not in changes and changes["definition"] != current.definition:
                merged.pop("version", None)  # a pin is a version of the definition it was made for
        spec = ScheduleSpec.model_validate(merged)  # ValidationError: the API's 422
        _require_definition(conn, spec)
        events: list[ev.EventData] = []
        if spec.stored() != row["spec"]:
            events.append(ev.ScheduleUpdated(spec=spec.stored(),
                                             next_at=cron.next_after(spec.cron, spec.timezone, at)))
        if spec.paused != row["paused"]:
            events.append(ev.SchedulePaused() if spec.paused
                          else ev.ScheduleResumed(next_at=cron.next_after(spec.cron, spec.timezone, at)))
        store.append(conn, [NewEvent(stream_id=row["id"], version=row["version"] + n, data=data)
                           for n, data in enumerate(events, start=1)], actor=actor, now=now)
    return get_schedule(conn, name)


def delete_schedule(conn, name: str, *, actor: str = "api", now: datetime | None = None) -> None:
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(q("schedule_lock"), {"name": name}).fetchone()
        if row is None:
            raise NotFound(f"schedule {name} not found")
        store.append(conn, [NewEvent(stream_id=row["id"], version=row["version"] + 1,
                                    data=ev.ScheduleDeleted())], actor=actor, now=now)


def get_schedule(conn, name: str) -> dict | None:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(q("schedule_get"), {"name": name}).fetchone()
    return _with_errors(conn, [view(row)])[0] if row else None


def list_schedules(conn) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        return _with_errors(conn, [view(row) for row in cur.execute(q("schedule_list")).fetchall()])


def view(row: dict[str, Any]) -> dict[str, Any]:
    spec = row["spec"]
    return {"id": row["id"], "name": row["name"], **spec, "paused": row["paused"],
            "next_fire_at": None if row["paused"] else row["next_fire_at"],
            "last_tick": row["last_tick"], "last_execution_id": row["last_execution_id"],
            "fired": row["fired"], "skipped": row["skipped"],
            "created_at": row["created_at"], "updated_at": row["updated_at"], "error": None}


def _with_errors(conn, views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Say on each schedule why its ticks cannot fire, when they cannot: the monitor's firing
    refuses a tick of a schedule whose definition does not exist (fire_due logs it), and
    that refusal is decided by what is stored, so it is read here the same way."""
    named = sorted({v["definition"] for v in views if v.get("definition")})
    if not named:
        return views
    with conn.cursor(row_factory=dict_row) as cur:
        known = {row["name"] for row in cur.execute(q("definitions_known"), {"names": named})}
    for item in views:
        if item.get("definition") and item["definition"] not in known:
            item["error"] = (f"cannot fire: definition {item['definition']} does not exist "
                             "(PUT /definitions/{name} stores it, or PATCH the schedule)")
    return views


# --------------------------------------------------------------------------- firing (the monitor)

def fire_due(conn, *, actor: str, grace_seconds: float, now: datetime | None = None,
             limit: int = 100) -> int:
    """Fire every tick that has come, of every schedule; returns the ticks fired."""
    at = _now(now)
    with conn.cursor(row_factory=dict_row) as cur:
        names = [row["name"] for row in cur.execute(q("schedule_due"), {"now": at, "limit": limit})]
    fired = 0
    for name in names:
        try:
            fired += fire_schedule(conn, name, actor=actor, grace_seconds=grace_seconds, now=at)
        except CommandError as exc:  # e.g. its definition is gone: the others still fire
            refusals.warn(f"{name}: {exc.message}", f"schedule {name} cannot fire: {exc.message}")
    return fired


# A schedule refused at every tick (four a second) writes one line a minute.
refusals = OncePerInterval(log)


def choose_ticks(ticks: list[datetime], now: datetime, grace_seconds: float,
                 catch_up: CatchUp) -> list[datetime]:
    """Which of the due ticks fire: those within the grace always; of the older (missed)
    ones, none, the latest or all, as catch_up says."""
    cutoff = now - timedelta(seconds=grace_seconds)
    missed = [t for t in ticks if t < cutoff]
    recent = [t for t in ticks if t >= cutoff]
    if catch_up == "all":
        return ticks
    if catch_up == "latest":
        return missed[-1:] + recent
    return recent


def fire_schedule(conn, name: str, *, actor: str, grace_seconds: float, now: datetime | None = None) -> int:
    at = _now(now)
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(q("schedule_lock"), {"name": name}).fetchone()
        # Locked: another firer that got here first has moved next_fire_at on.
        if row is None or row["paused"] or row["next_fire_at"] is None or row["next_fire_at"] > at:
            return 0
        spec = _spec_of(row)
        ticks = cron.ticks_through(spec.cron, spec.timezone, row["next_fire_at"], at)
        firing = choose_ticks(ticks, at, grace_seconds, spec.catch_up)
        next_at = cron.next_after(spec.cron, spec.timezone, ticks[-1])
        events: list[ev.EventData] = []
        skipped = [t for t in ticks if t not in firing]
        if skipped:
            events.append(ev.ScheduleSkipped(count=len(skipped), first=skipped[0], last=skipped[-1],
                                             catch_up=spec.catch_up, next_at=next_at))
        created = (cur.execute(q("schedule_created_trace"), {"id": row["id"]}).fetchone() or {}).get("trace") \
            if tracing.active() and firing else None
        for tick in firing:
            # each fire is a trace of its own, linked to the schedule's creation
            with tracing.span("qforge.schedule.fire", root=True, link=created, producer=False,
                              schedule=spec.name, tick=tick.isoformat()) as traced:
                kind, execution_id = _start(conn, spec, tick, actor=actor)
                traced.set(kind=kind, execution_id=execution_id)
            events.append(ev.ScheduleFired(tick=tick, kind=kind, execution_id=execution_id, next_at=next_at))
        store.append(conn, [NewEvent(stream_id=row["id"], version=row["version"] + n, data=data)
                           for n, data in enumerate(events, start=1)], actor=actor)
    return len(firing)


def tick_key(name: str, tick: datetime) -> str:
    return f"schedule:{name}:{tick.astimezone(timezone.utc).isoformat()}"


def _start(conn, spec: ScheduleSpec, tick: datetime, *, actor: str) -> tuple[str, UUID]:
    key = tick_key(spec.name, tick)
    if spec.job is not None:
        job = spec.job.model_copy(update={"idempotency_key": key,
                                          "tags": {"schedule": spec.name, **spec.job.tags}})
        [outcome] = enqueue(conn, [job], actor=actor)
        return "job", outcome.id
    return "workflow", start_definition(conn, spec.definition, spec.inputs or {}, actor=actor,
                                                    idempotency_key=key, version=spec.version)


def next_due(conn) -> datetime | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(q("schedule_next_due")).fetchone()["at"]
