"""Event types: facts in the past tense, one frozen model per type for its data, with schema versions.

Every event of the log has the envelope of `Event` and a `data` object whose
shape is the model named by its `type` (`EVENT_DATA`). A model's
`schema_version` is the version new events are written in; an older stored
shape is turned into the current one by the upcaster registered beside its
model (`UPCASTERS`), on read, so stored events are never rewritten. The same
rule runs inside the database for the fold (`event_upcast`, definitions/10_log.sql);
tests check that both agree.

Fields that are absent in stored data take the model's defaults, so a default
here is part of the schema: changing one means a new schema version and an
upcaster. The data base model and the events of streams without a status machine
(tokens, schedules, queues, keys) live in control_types.py and are re-exported here.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from qforge.events.control_types import (  # noqa: F401 (re-exported: ev.TokenCreated, ...)
    EventData, TokenCreated, TokenRevoked, ScheduleCreated, ScheduleUpdated, SchedulePaused,
    ScheduleResumed, ScheduleFired, ScheduleSkipped, ScheduleDeleted, QueueConfigured, QueuePaused,
    QueueResumed, KeyConfigured,
)


# --------------------------------------------------------------------------- jobs (and workflow steps)


class Enqueued(EventData):
    """A job (or a workflow's step) exists. A step also names its place in the graph."""

    type = "Enqueued"
    stream_type = "job"
    task: str
    queue: str = "default"
    priority: int = 0
    max_retries: int = 3
    run_at: datetime | None = None  # None: due when it occurred
    payload: dict[str, Any] = Field(default_factory=dict)
    status: Literal["pending", "blocked", "waiting"] = "pending"
    timeout_seconds: float | None = None
    idempotency_key: str | None = None
    step: str | None = None
    step_type: str | None = None
    depends_on: list[str] | None = None
    when: dict[str, Any] | str | None = None  # a condition, or "otherwise"
    on_failure: str | None = None
    seconds: float | None = None
    # flow control: at most concurrency_limit jobs with the key run at once;
    # jobs with a fairness key are claimed round-robin across keys
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    fairness_key: str | None = None
    # The enqueuer's trace context (W3C traceparent/tracestate): the worker's run span joins it.
    trace: dict[str, str] | None = None
    element_of: str | None = None  # an element of a fan-out step: that step's name
    element_index: int | None = None  # and its index in the list it runs over
    backoff_base_seconds: float | None = None  # None: QFORGE_BACKOFF_BASE_SECONDS
    backoff_cap_seconds: float | None = None  # None: QFORGE_BACKOFF_CAP_SECONDS


class StepUnblocked(EventData):
    """A blocked step's dependencies are done (and its condition holds): it becomes due or starts waiting."""

    type = "StepUnblocked"
    stream_type = "job"
    status: Literal["pending", "waiting"]
    run_at: datetime | None = None
    inputs: dict[str, Any] = Field(default_factory=dict)
    failed_step: str | None = None  # set when a failure handler is started
    error: str | None = None


class Skipped(EventData):
    type = "Skipped"
    stream_type = "job"
    reason: str
    when: dict[str, Any] | None = None


class Claimed(EventData):
    type = "Claimed"
    stream_type = "job"
    attempt: int = Field(ge=1, description="the fencing token every later report of this attempt names")
    worker: str | None = None  # None: the event's actor, which is the worker


class Heartbeat(EventData):
    type = "Heartbeat"
    stream_type = "job"
    attempt: int
    worker: str | None = None  # None: the event's actor


class Succeeded(EventData):
    type = "Succeeded"
    stream_type = "job"
    attempt: int | None = None  # None: a sleep step's timer, not a worker
    result: Any = None


class Failed(EventData):
    """A failed attempt; the same transaction appends Retried or DeadLettered after it."""

    type = "Failed"
    stream_type = "job"
    schema_version = 2
    attempt: int
    reason: str = "error"  # error | timeout | heartbeat_timeout | ...
    error: str
    result: Any = None  # a task's partial output, when it left one


class Retried(EventData):
    type = "Retried"
    stream_type = "job"
    attempt: int
    delay_seconds: float
    run_at: datetime
    manual: bool = False  # an operator's retry of a dead or cancelled job: a fresh retry budget
    batch_id: UUID | None = None  # the batch of a bulk retry (POST /jobs/retry) that made it


class DeadLettered(EventData):
    type = "DeadLettered"
    stream_type = "job"
    attempt: int
    error: str | None = None


class Released(EventData):
    """A stopping worker handed the job back without using up its attempt."""

    type = "Released"
    stream_type = "job"
    attempt: int
    reason: str


class Cancelled(EventData):
    type = "Cancelled"
    stream_type = "job"
    reason: str
    batch_id: UUID | None = None  # the batch of a bulk cancel (POST /jobs/cancel) that made it


class StepReopened(EventData):
    """A finished step of a resumed workflow runs again (a resume, or an operator's retry of a
    dead step): blocked until the DAG rules unblock it, or at once pending/waiting; its retry
    budget starts afresh and its previous output and error are cleared."""

    type = "StepReopened"
    stream_type = "job"
    status: Literal["blocked", "pending", "waiting"]
    run_at: datetime | None = None  # None: when it occurred
    reason: str = "resume"
    batch_id: UUID | None = None  # the batch of a bulk retry (POST /jobs/retry) that reopened it


class Triggered(EventData):
    """A waiting wait_for_trigger step was triggered; the payload is its output."""

    type = "Triggered"
    stream_type = "job"
    payload: dict[str, Any] = Field(default_factory=dict)


# --------------------------------------------------------------------------- workflows


class WorkflowSubmitted(EventData):
    type = "WorkflowSubmitted"
    stream_type = "workflow"
    name: str
    steps: list[dict[str, Any]]
    idempotency_key: str | None = None
    external_id: str | None = None
    result: dict[str, Any] | None = None  # {"step", "path"?}: what WorkflowSucceeded returns
    deadline_seconds: float | None = None
    deadline_at: datetime | None = None  # submitted + deadline_seconds: then it fails with reason deadline
    definition: dict[str, Any] | None = None  # {"name", "version"}: the stored definition it runs
    parent: dict[str, Any] | None = None  # {"workflow_id", "step", "job_id", "depth"}: a sub-workflow's
    # a workflow written as code: the @qforge.workflow name it runs and its input (steps is [])
    code: str | None = None
    input: Any = None


class WorkflowSucceeded(EventData):
    type = "WorkflowSucceeded"
    stream_type = "workflow"
    result: Any = None  # the output the workflow's "result" names, when it names one


class WorkflowFailed(EventData):
    type = "WorkflowFailed"
    stream_type = "workflow"
    error: str | None = None
    reason: str | None = None  # None: a step failed; "deadline": the workflow ran out of time


class WorkflowCancelled(EventData):
    type = "WorkflowCancelled"
    stream_type = "workflow"


class WorkflowResumed(EventData):
    """A failed or cancelled workflow runs again: `steps` are reopened (StepReopened, same
    transaction); every other step keeps its status and output."""

    type = "WorkflowResumed"
    stream_type = "workflow"
    steps: list[str]
    reason: str = "resume"  # resume | retry of step '<name>'
    deadline_at: datetime | None = None  # a new deadline, when the workflow has deadline_seconds


# --------------------------------------------------------------------------- stored definitions


class DefinitionStored(EventData):
    """A new version of a stored workflow definition (its stream's version is the definition's)."""

    type = "DefinitionStored"
    stream_type = "definition"
    name: str
    document: dict[str, Any]


EVENT_DATA: dict[str, type[EventData]] = {
    model.type: model for model in (
        Enqueued, StepUnblocked, Skipped, Claimed, Heartbeat, Succeeded, Failed, Retried,
        DeadLettered, Released, Cancelled, StepReopened, Triggered,
        WorkflowSubmitted, WorkflowSucceeded, WorkflowFailed, WorkflowCancelled, WorkflowResumed,
        DefinitionStored,
        TokenCreated, TokenRevoked,
        ScheduleCreated, ScheduleUpdated, SchedulePaused, ScheduleResumed, ScheduleFired,
        ScheduleSkipped, ScheduleDeleted, QueueConfigured, QueuePaused, QueueResumed,
        KeyConfigured,
    )
}
EVENT_TYPES = frozenset(EVENT_DATA)
JOB_EVENT_TYPES = frozenset(name for name, m in EVENT_DATA.items() if m.stream_type == "job")
WORKFLOW_EVENT_TYPES = frozenset(name for name, m in EVENT_DATA.items() if m.stream_type == "workflow")
TOKEN_EVENT_TYPES = frozenset(name for name, m in EVENT_DATA.items() if m.stream_type == "token")
FLOW_EVENT_TYPES = frozenset(name for name, m in EVENT_DATA.items() if m.stream_type in ("schedule", "queue", "key"))
DEFINITION_EVENT_TYPES = frozenset(name for name, m in EVENT_DATA.items() if m.stream_type == "definition")
STREAM_TYPES = ("job", "workflow", "definition", "token", "schedule", "queue", "key")


def _failed_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Failed v1 carried {"attempt", "message"}; v2 names why: {"attempt", "reason", "error"}."""
    upcast = {key: value for key, value in data.items() if key != "message"}
    upcast.setdefault("reason", "error")
    upcast["error"] = data.get("error", data.get("message"))
    return upcast


# (type, stored schema version) -> the function that turns that shape into the next version's.
UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("Failed", 1): _failed_v1,
}


def upcast(event_type: str, schema_version: int, data: dict[str, Any]) -> dict[str, Any]:
    """Stored data of any version -> the data of the current version of its type."""
    if event_type == TokenCreated.type and "sha256" in data:
        # the digest old TokenCreated events carried: never served (event_upcast_data's twin)
        data = {key: value for key, value in data.items() if key != "sha256"}
    current = EVENT_DATA[event_type].schema_version
    while schema_version < current:
        data = UPCASTERS[(event_type, schema_version)](data)
        schema_version += 1
    return data


def expand(event_type: str, schema_version: int, data: dict[str, Any], actor: str,
           occurred_at: datetime) -> dict[str, Any]:
    """What readers see of a stored event's data: the current shape, with the fields its
    writer left at their defaults written out (the twin of event_read_data in the database)."""
    data = upcast(event_type, schema_version, data)
    if event_type == Enqueued.type:
        at = occurred_at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")
        return {"queue": "default", "priority": 0, "max_retries": 3, "payload": {}, "status": "pending",
                "run_at": at, **data}
    if event_type in (Claimed.type, Heartbeat.type):
        return {"worker": actor, **data}
    if event_type == Succeeded.type:
        return {"result": None, **data}
    return data


def parse_data(event_type: str, schema_version: int, data: dict[str, Any]) -> EventData:
    """The typed data of a stored event (ValueError for an unknown type, ValidationError for a bad shape)."""
    model = EVENT_DATA.get(event_type)
    if model is None:
        raise ValueError(f"unknown event type {event_type!r}")
    return model.model_validate(upcast(event_type, schema_version, data))


class NewEvent(BaseModel):
    """An event about to be appended; the database assigns position and xid."""

    model_config = ConfigDict(frozen=True)

    stream_id: UUID
    version: int
    data: EventData
    tags: dict[str, str] = Field(default_factory=dict)
    workflow_id: UUID | None = None
    actor: str | None = None

    @property
    def type(self) -> str:
        return self.data.type

    def row(self) -> dict[str, Any]:
        """The row events_append takes (absent optional fields are not stored; tags only on a
        stream's first event)."""
        return {
            "stream_type": self.data.stream_type, "stream_id": str(self.stream_id),
            "version": self.version, "type": self.data.type,
            "schema_version": self.data.schema_version,
            "data": self.data.model_dump(mode="json", exclude_none=True),
            "tags": self.tags if self.version == 1 else None,
            "workflow_id": str(self.workflow_id) if self.workflow_id else None,
            "actor": self.actor,
        }


class Event(BaseModel):
    """A stored event, as read back (already upcast to the current schema)."""

    model_config = ConfigDict(frozen=True)

    position: int
    stream_type: str
    stream_id: UUID
    version: int
    type: str
    schema_version: int
    data: dict[str, Any]
    tags: dict[str, str]
    workflow_id: UUID | None = None
    occurred_at: datetime
    actor: str
    xid: int = Field(exclude=True)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Event":
        return cls(**{**row, "xid": int(row["xid"])})

    def typed(self) -> EventData:
        return parse_data(self.type, self.schema_version, self.data)
