"""The event data's base model, and the events of the streams without a status machine:
API tokens, schedules, queue settings and keys (flow control). `qforge.events.types`
re-exports every one of them, so `ev.ScheduleCreated` and the registry `EVENT_DATA` stay
where readers look for them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field


class EventData(BaseModel):
    """The data of one event type (subclasses name their type and stream)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: ClassVar[str]
    stream_type: ClassVar[str]
    schema_version: ClassVar[int] = 1


# --------------------------------------------------------------------------- API tokens


class TokenCreated(EventData):
    """A named API token exists (again, after a revocation: a new secret). Neither the
    secret nor its digest is in the log (the digest is in token_secrets, which only the
    schema owner reads); the stream id is the token's non-secret id. Events written
    before 0.3 carried the digest: `upcast` drops it, so no reader ever sees it."""

    type = "TokenCreated"
    stream_type = "token"
    name: str
    scope: Literal["read", "operate", "admin"]


class TokenRevoked(EventData):
    """The token stops working on every API process at once (each request looks it up)."""

    type = "TokenRevoked"
    stream_type = "token"
    name: str


# --------------------------------------------------------------------------- flow control
# Schedules and queue settings are streams of their own, without a status
# machine: their folds (definitions/65_flow.sql) keep rows of settings.

class ScheduleCreated(EventData):
    """A schedule exists: `spec` is the validated body (cron, timezone, job | definition,
    inputs, catch_up); next_at is its first tick after the creation."""
    type = "ScheduleCreated"
    stream_type = "schedule"
    name: str
    spec: dict[str, Any]
    next_at: datetime | None = None
    # the creating span's trace context: every fire's own trace links to it
    trace: dict[str, str] | None = None


class ScheduleUpdated(EventData):
    """The schedule's spec replaced (a PATCH); next_at recomputed from now."""
    type = "ScheduleUpdated"
    stream_type = "schedule"
    spec: dict[str, Any]
    next_at: datetime | None = None


class SchedulePaused(EventData):
    type = "SchedulePaused"
    stream_type = "schedule"


class ScheduleResumed(EventData):
    """Ticks while it was paused are not fired: the next one after the resume is."""
    type = "ScheduleResumed"
    stream_type = "schedule"
    next_at: datetime | None = None


class ScheduleFired(EventData):
    """One tick fired: the job (or workflow) it started, whose idempotency key is the
    schedule's name and the tick."""
    type = "ScheduleFired"
    stream_type = "schedule"
    tick: datetime
    kind: Literal["job", "workflow"]
    execution_id: UUID
    next_at: datetime | None = None


class ScheduleSkipped(EventData):
    """Ticks missed while nothing could fire them (downtime), that catch_up said not to fire."""
    type = "ScheduleSkipped"
    stream_type = "schedule"
    count: int = Field(ge=1)
    first: datetime
    last: datetime
    catch_up: str
    next_at: datetime | None = None


class ScheduleDeleted(EventData):
    type = "ScheduleDeleted"
    stream_type = "schedule"


class QueueConfigured(EventData):
    """A queue's rate limit (null: none): claims start at most rate_per_second, with
    bursts of up to `burst`."""
    type = "QueueConfigured"
    stream_type = "queue"
    queue: str
    rate_per_second: float | None = None
    burst: int | None = None


class QueuePaused(EventData):
    """Nothing of the queue is claimed until QueueResumed (running jobs finish)."""
    type = "QueuePaused"
    stream_type = "queue"
    queue: str


class QueueResumed(EventData):
    type = "QueueResumed"
    stream_type = "queue"
    queue: str


class KeyConfigured(EventData):
    """A key's limits, set centrally (PUT /keys/{key}), whole: concurrency_limit (null: each job's
    own) for jobs with this concurrency_key, weight (turns per rotation) for jobs with this
    fairness_key, rate_per_second / burst (null: none) for either, over all queues."""
    type = "KeyConfigured"
    stream_type = "key"
    key: str
    concurrency_limit: int | None = None
    weight: int = 1
    rate_per_second: float | None = None
    burst: int | None = None
