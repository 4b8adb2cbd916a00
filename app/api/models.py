"""Request and response models of the HTTP API (what /openapi.json describes)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Union
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, RootModel, create_model

from qforge.commands.specs import ForEach, Storable, When
from qforge.events.types import EVENT_DATA, EventData

# --------------------------------------------------------------------------- errors


class ErrorBody(BaseModel):
    error: str = Field(description="a stable code: invalid, not_found, conflict, ...")
    message: str = Field(description="a human sentence naming the field or the state")
    details: list[Any] = Field(default_factory=list)


# --------------------------------------------------------------------------- jobs


class JobView(BaseModel):
    id: UUID
    task: str
    queue: str
    status: str
    priority: int
    attempts: int = Field(description="claims so far, hand-backs included (the fencing token)")
    counted_attempts: int | None = Field(default=None, description=(
        "the attempts that count against max_retries: a hand-back by a stopping worker (Released) "
        "uses none, and an operator's retry starts the count again"))
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
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    fairness_key: str | None = None
    waiting_for_worker: str | None = Field(default=None, description=(
        "GET /jobs/{id} of a pending job: why no live worker would take it (no worker serves its "
        "queue, or none registers its task); null otherwise"))


class JobList(BaseModel):
    items: list[JobView]
    next: str | None = Field(description="pass as ?cursor= for the next page; null on the last")


class BulkResult(BaseModel):
    count: int = Field(description="jobs acted on (with dry_run: jobs that match now)")
    next: UUID | None = Field(default=None, description="with a limit that was reached: pass as `after` "
                                                         "to go on; null when every match was seen")


# --------------------------------------------------------------------------- events


class EventEnvelope(BaseModel):
    position: int
    stream_type: str
    stream_id: UUID
    version: int
    schema_version: int
    tags: dict[str, str]
    workflow_id: UUID | None = None
    occurred_at: datetime
    actor: str


def _typed_event(data_model: type[EventData]) -> type[EventEnvelope]:
    """`{...envelope, "type": "<Type>", "data": <its model>}`: one schema component per event type."""
    return create_model(f"{data_model.type}Event", __base__=EventEnvelope,
                        __doc__=f"A {data_model.type} event: {(data_model.__doc__ or '').strip()}".strip(": "),
                        type=(Literal[data_model.type], ...), data=(data_model, ...))


class Event(RootModel[Annotated[Union[tuple(_typed_event(m) for m in EVENT_DATA.values())],  # type: ignore[misc]
                                Field(discriminator="type")]]):
    """An event of the log: the envelope, its type and the data of that type."""


class EventHistory(BaseModel):
    events: list[Event]


class EventPage(BaseModel):
    events: list[Event]
    next: str = Field(description="the cursor to pass as ?after= for the following events")


class StreamTicket(BaseModel):
    ticket: str = Field(description="pass as GET /events/stream?ticket=")
    expires_in: int = Field(description="seconds it opens the stream for (QFORGE_STREAM_TICKET_SECONDS)")


# --------------------------------------------------------------------------- workflows


class ElementView(BaseModel):
    index: int
    job_id: UUID
    status: str
    attempts: int
    error: str | None = None


class ElementsView(BaseModel):
    """A fan-out step's elements: counts by status and each element."""

    total: int
    counts: dict[str, int]
    items: list[ElementView]


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
    # The step as declared: each field of StepSpec it shows has StepSpec's type, so every
    # form a request takes comes back (tests/test_surface.py checks that for every field).
    type: str = "task"
    task: str | None = None
    when: When | None = None
    on_failure: str | None = None
    seconds: float | None = None  # a sleep step's
    for_each: ForEach | None = None
    max_parallel: int | None = None
    definition: str | None = Field(default=None, description="a workflow step's stored definition")
    inputs: dict[str, Any] | None = None  # a workflow step's inputs
    elements: ElementsView | None = None  # a for_each step's elements
    child_workflow_id: UUID | None = None  # a workflow step's sub-workflow
    input: Any = None  # a code workflow's step: the payload its function gave it


class WaitingOn(BaseModel):
    step: str
    kind: str  # trigger | timer
    until: datetime | None = None


class WorkflowView(BaseModel):
    id: UUID
    name: str
    status: str
    tags: dict[str, str]
    created_at: datetime
    finished_at: datetime | None = None
    steps: list[StepView]
    # beyond 0.1.0's shape: why it failed, what it returned ("result"), its deadline
    error: str | None = None
    result: Any = None
    deadline_seconds: float | None = None
    deadline_at: datetime | None = None
    definition: dict[str, Any] | None = None  # {"name", "version"}: the stored definition it ran
    parent: dict[str, Any] | None = None  # {"workflow_id", "step"}: a sub-workflow's parent step
    waiting_on: list[WaitingOn] = []  # what a running workflow waits for, when only a trigger or timer
    code: str | None = None  # a workflow written as code: its @qforge.workflow name
    input: Any = None  # and the input it was started with
    outcome: str | None = Field(default=None, description=(
        "why it ended as it did (null while it runs), e.g. \"succeeded: a death whose handler succeeds "
        "does not fail the workflow (charge died; its handler refund succeeded; ship was skipped "
        "because charge died)\"; the rule is in docs/workflows.md"))


class WorkflowCreated(BaseModel):
    id: UUID
    name: str
    status: str
    steps: list[StepView]
    code: str | None = None  # a workflow written as code: its @qforge.workflow name


# `duplicates` pairs these fields with EventEnvelope's by their shape alone (a run of typed
# fields): different things, nothing to share.
class WorkflowSummary(BaseModel):
    id: UUID
    name: str
    status: str
    tags: dict[str, str]
    error: str | None = None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    step_counts: dict[str, int] = Field(description="how many steps are in each status (a fan-out step "
                                                    "counts once, as on GET /workflows/{id})")
    element_counts: dict[str, int] = Field(default_factory=dict, description=(
        "how many elements of its fan-out (for_each) steps are in each status"))


class WorkflowList(BaseModel):
    items: list[WorkflowSummary]
    next: str | None


class TriggerRequest(Storable):
    model_config = ConfigDict(extra="forbid")

    payload: dict[str, Any] | None = Field(default=None, description="becomes the step's output")


# --------------------------------------------------------------------------- search


class JobExecution(JobView):
    """A job found by GET /executions."""

    kind: Literal["job"]


class WorkflowExecution(WorkflowSummary):
    """A workflow found by GET /executions."""

    kind: Literal["workflow"]


class ExecutionList(BaseModel):
    items: list[Annotated[Union[JobExecution, WorkflowExecution], Field(discriminator="kind")]] = Field(
        description='newest first; each is a job (as GET /jobs/{id}) or a workflow summary (as in '
                    'GET /workflows), with "kind": "job" | "workflow"')
    next: str | None


# --------------------------------------------------------------------------- operations


class QueueStats(BaseModel):
    queue: str
    counts: dict[str, int] = Field(description="jobs by status (every status, zeros included)")
    oldest_pending_age_seconds: float | None = Field(
        description="how long the oldest due pending job has waited; null when none waits")
    paused: bool = Field(default=False, description="a paused queue is not claimed (PUT /queues/{name})")
    rate_per_second: float | None = Field(default=None, description="claims per second at most; null: no limit")
    burst: int | None = None
    workers: int = Field(default=0, description="live workers that serve this queue")
    warnings: list[str] = Field(default_factory=list, description=(
        "due jobs that no live worker takes: the queue is served by none, or a task is registered by none"))


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
    tasks: list[str] | None = Field(default=None, description="the tasks it can run (null: not said)")


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


# --------------------------------------------------------------------------- keys (PUT/GET /keys)

class KeyView(BaseModel):
    key: str
    configured: bool  # false: nothing set here, the key runs as its jobs say
    concurrency_limit: int | None  # configured; null: each job's own concurrency_limit
    weight: int
    rate_per_second: float | None
    burst: int | None
    concurrency_limit_in_force: int | None  # what the claim applies now (null: no job used the key yet)
    running: int  # jobs of the key running now
    fairness_claimed: int  # jobs of the fairness key claimed so far (the rotation's count)
    updated_at: datetime | None


class KeyList(BaseModel):
    items: list[KeyView]
    next: str | None = None
