"""Request and response models of the HTTP API (what /openapi.json describes)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.commands.enqueue import NAME_PATTERN, JobSpec
from app.commands.workflows import Condition

STEP_TYPES_TEXT = "task (default) | wait_for_trigger | sleep"


MAX_DEPTH = 64  # nesting of objects and lists in a body (serializers give up near 255)


def storable_problems(value: Any, where: str = "", depth: int = 0) -> list[str]:
    """What PostgreSQL could not store in jsonb/text, or we could not send back: NUL
    characters, lone surrogates, NaN/Infinity (which Python's JSON parser accepts), and
    nesting deeper than MAX_DEPTH."""
    problems: list[str] = []
    if depth > MAX_DEPTH:
        return [f"{where or 'value'}: nested more than {MAX_DEPTH} levels deep"]
    if isinstance(value, str):
        if "\x00" in value:
            problems.append(f"{where or 'value'}: NUL characters are not allowed")
        else:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                problems.append(f"{where or 'value'}: invalid Unicode (lone surrogate)")
    elif isinstance(value, float):
        if not math.isfinite(value):
            problems.append(f"{where or 'value'}: NaN and Infinity are not JSON numbers")
    elif isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            problems.extend(storable_problems(key, f"{path} (key)") if isinstance(key, str) else [])
            problems.extend(storable_problems(item, path, depth + 1))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problems.extend(storable_problems(item, f"{where}[{index}]", depth + 1))
    return problems


class Storable(BaseModel):
    """Rejects values PostgreSQL cannot store before anything else looks at them."""

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        problems = storable_problems(data)
        if problems:
            raise ValueError("; ".join(problems[:10]))
        return data


# --------------------------------------------------------------------------- errors


class ErrorBody(BaseModel):
    error: str = Field(description="a stable code: invalid, not_found, conflict, ...")
    message: str = Field(description="a human sentence naming the field or the state")
    details: list[Any] = Field(default_factory=list)


# --------------------------------------------------------------------------- jobs


class JobCreate(Storable, JobSpec):
    """POST /jobs: `{"task", "payload"?, "queue"?, "priority"?, "max_retries"?, "run_at"? |
    "delay_seconds"?, "timeout_seconds"?, "tags"?, "idempotency_key"?}`."""


class JobView(BaseModel):
    id: UUID
    task: str
    queue: str
    status: str
    priority: int
    attempts: int
    max_retries: int
    run_at: datetime
    payload: dict[str, Any]
    result: Any = None
    last_error: str | None = None
    tags: dict[str, str]
    workflow_id: UUID | None = None
    step: str | None = None
    worker: str | None = None
    heartbeat_at: datetime | None = None
    created_at: datetime
    updated_at: datetime


class JobList(BaseModel):
    items: list[JobView]
    next: str | None = Field(description="pass as ?cursor= for the next page; null on the last")


# --------------------------------------------------------------------------- events


class EventView(BaseModel):
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


class EventHistory(BaseModel):
    events: list[EventView]


class EventPage(BaseModel):
    events: list[EventView]
    next: str = Field(description="the cursor to pass as ?after= for the following events")


# --------------------------------------------------------------------------- workflows


class StepCreate(Storable):
    """One step of POST /workflows (the type is checked with the graph, so every problem
    of a definition is reported at once)."""

    model_config = ConfigDict(extra="forbid")

    step: str = Field(min_length=1, max_length=200)
    task: str | None = Field(default=None, min_length=1, max_length=200)
    payload: dict[str, Any] = Field(default_factory=dict)
    depends_on: list[str] = Field(default_factory=list, max_length=1000)
    when: Condition | None = None
    on_failure: str | None = Field(default=None, max_length=200)
    type: str = Field(default="task", max_length=100, description=STEP_TYPES_TEXT)
    seconds: float | None = Field(default=None, ge=0, le=30 * 86400)
    timeout_seconds: float | None = Field(default=None, gt=0, le=30 * 86400)
    max_retries: int = Field(default=3, ge=0, le=1000)
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    queue: str = Field(default="default", pattern=NAME_PATTERN)


class WorkflowCreate(Storable):
    """POST /workflows."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    tags: dict[str, str] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    steps: list[StepCreate] = Field(min_length=1, max_length=1000)


class StepView(BaseModel):
    step: str
    status: str
    job_id: UUID
    depends_on: list[str]
    output: Any = None
    error: str | None = None
    attempts: int
    started_at: datetime | None = None
    finished_at: datetime | None = None
    type: str = "task"
    task: str | None = None
    when: dict[str, Any] | None = None
    on_failure: str | None = None


class WorkflowView(BaseModel):
    id: UUID
    name: str
    status: str
    tags: dict[str, str]
    created_at: datetime
    finished_at: datetime | None = None
    steps: list[StepView]


class WorkflowCreated(BaseModel):
    id: UUID
    name: str
    status: str
    steps: list[StepView]


class WorkflowSummary(BaseModel):
    id: UUID
    name: str
    status: str
    tags: dict[str, str]
    error: str | None = None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    step_counts: dict[str, int] = Field(description="how many steps are in each status")


class WorkflowList(BaseModel):
    items: list[WorkflowSummary]
    next: str | None


class TriggerRequest(Storable):
    model_config = ConfigDict(extra="forbid")

    payload: dict[str, Any] | None = Field(default=None, description="becomes the step's output")


# --------------------------------------------------------------------------- search


class ExecutionList(BaseModel):
    items: list[dict[str, Any]] = Field(description=(
        'newest first; each is a job (as GET /jobs/{id}) or a workflow summary (as in '
        'GET /workflows), with "kind": "job" | "workflow"'))
    next: str | None


# --------------------------------------------------------------------------- operations


class QueueStats(BaseModel):
    queue: str
    counts: dict[str, int] = Field(description="jobs by status (every status, zeros included)")
    oldest_pending_age_seconds: float | None = Field(
        description="how long the oldest due pending job has waited; null when none waits")


class QueueList(BaseModel):
    items: list[QueueStats]
    next: str | None = None


class WorkerView(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    running: list[dict[str, Any]] = Field(description="the jobs it runs, as of last_seen")
    last_seen: datetime
    started_at: datetime | None = None


class WorkerList(BaseModel):
    items: list[WorkerView]
    next: str | None = None


class Health(BaseModel):
    status: Literal["ok"]


# --------------------------------------------------------------------------- compat


class CompatStepIn(Storable):
    """A step of the pod orchestrator's POST /workflow (unknown fields are ignored, as there)."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1, max_length=200)
    command: str = Field(min_length=1, max_length=100_000)
    dependsOn: list[str] = Field(default_factory=list, max_length=1000)


class CompatWorkflowIn(Storable):
    model_config = ConfigDict(extra="ignore")

    workflowId: str = Field(min_length=1, max_length=200)
    steps: list[CompatStepIn] = Field(min_length=1, max_length=1000)


CompatStatus = Literal["PENDING", "QUEUED", "RUNNING", "COMPLETED", "FAILED", "SKIPPED"]


class CompatStepView(BaseModel):
    id: str
    command: str | None = None
    dependsOn: list[str]
    status: CompatStatus
    stdout: str | None = None
    exitCode: int | None = None
    startedAt: datetime | None = None
    finishedAt: datetime | None = None
    lastHeartbeatAt: datetime | None = None


class CompatWorkflowView(BaseModel):
    workflowId: str
    status: Literal["RUNNING", "COMPLETED", "FAILED"]
    steps: list[CompatStepView]


class Pods(BaseModel):
    total: int = Field(description="live worker slots")
    available: int = Field(description="free slots")
    leased: list[str] = Field(description="names of busy slots")
