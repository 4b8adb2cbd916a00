"""Workflow commands: submit, advance (unblock/skip/finish), trigger, cancel, fire timers."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from psycopg.rows import dict_row
from pydantic import BaseModel, ConfigDict, Field

from psycopg.rows import tuple_row
from app.commands import dag
from app.commands.enqueue import NAME_PATTERN, JobSpec, enqueued_data
from app.commands.errors import Conflict, Invalid, NotFound
from app.events import store
from app.events import types as ev
from app.events.states import JOB_ACTIVE, WORKFLOW_FINISHED
from app.events.types import NewEvent
from app.events.ids import new_id
from app.sql import q


class Condition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: str
    path: str | None = None
    equals: Any = None
    not_equals: Any = None
    in_: list[Any] | None = Field(default=None, alias="in")


class StepSpec(BaseModel):
    """One step of POST /workflows."""

    model_config = ConfigDict(extra="forbid")

    step: str = Field(min_length=1, max_length=200)
    task: str | None = Field(default=None, min_length=1, max_length=200)
    payload: dict[str, Any] = Field(default_factory=dict)
    depends_on: list[str] = Field(default_factory=list)
    when: Condition | None = None
    on_failure: str | None = None
    type: Literal["task", "wait_for_trigger", "sleep"] = "task"
    seconds: float | None = Field(default=None, ge=0, le=30 * 86400)
    timeout_seconds: float | None = Field(default=None, gt=0, le=30 * 86400)
    max_retries: int = Field(default=3, ge=0, le=1000)
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    queue: str = Field(default="default", pattern=NAME_PATTERN)

    def definition(self) -> dag.StepDef:
        when = None
        if self.when is not None:
            when = self.when.model_dump(by_alias=True, exclude_unset=True)
        return dag.StepDef(name=self.step, type=self.type, task=self.task,
                           depends_on=tuple(self.depends_on), when=when,
                           on_failure=self.on_failure, seconds=self.seconds)


class WorkflowSpec(BaseModel):
    """POST /workflows."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    tags: dict[str, str] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    steps: list[StepSpec] = Field(min_length=1, max_length=1000)
    external_id: str | None = Field(default=None, exclude=True)  # compat: POST /workflow

    def problems(self) -> list[str]:
        problems = dag.validate([s.definition() for s in self.steps])
        JobSpec.model_validate({"task": "x", "tags": self.tags})  # same tag rules as jobs
        return problems


def _step_job(step: StepSpec, handlers: dict[str, list[str]], now: datetime) -> dict[str, Any]:
    definition = step.definition()
    status = dag.initial_status(definition, handlers)
    spec = JobSpec(task=step.task or step.type, payload=step.payload, queue=step.queue,
                   priority=step.priority, max_retries=step.max_retries,
                   timeout_seconds=step.timeout_seconds)
    data = enqueued_data(spec, now, status=status, step=step.step, step_type=step.type,
                         depends_on=list(definition.dependencies()), when=definition.when,
                         on_failure=step.on_failure, seconds=step.seconds)
    if status == "waiting":
        data["run_at"] = _wait_until(step.type, step.seconds, step.timeout_seconds, now)
    return data


# A trigger wait without timeout never fires (PostgreSQL's 'infinity' would not load in Python).
NEVER = "9999-12-31T00:00:00+00:00"


def _wait_until(step_type: str, seconds: float | None, timeout: float | None,
                now: datetime) -> str:
    """When a wait step's timer fires: a sleep ends, a trigger wait times out (or never)."""
    delay = seconds if step_type == "sleep" else timeout
    return NEVER if delay is None else (now + timedelta(seconds=delay)).isoformat()


def submit(conn, spec: WorkflowSpec, *, actor: str = "api",
           now: datetime | None = None) -> tuple[uuid.UUID, bool]:
    """Validate, then store the workflow and its steps; (id, created)."""
    problems = spec.problems()
    if problems:
        raise Invalid("invalid workflow: " + "; ".join(problems), problems)
    clock = now or datetime.now(timezone.utc)
    workflow_id = new_id()
    handlers = dag.handlers_of(s.definition() for s in spec.steps)
    data: dict[str, Any] = {"name": spec.name,
                            "steps": [s.model_dump(mode="json", by_alias=True, exclude_none=True)
                                      for s in spec.steps]}
    if spec.idempotency_key:
        data["idempotency_key"] = spec.idempotency_key
    if spec.external_id:
        data["external_id"] = spec.external_id
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(q("workflow_submit"), {"id": workflow_id, "data": json.dumps(data),
                                           "tags": json.dumps(spec.tags), "now": now,
                                           "actor": actor})
        if cur.fetchone() is None:
            cur.execute(q("workflow_by_idempotency_key"), {"key": spec.idempotency_key})
            return cur.fetchone()[0], False
        rows = [{"id": str(new_id()), "data": _step_job(step, handlers, clock),
                 "tags": spec.tags, "workflow_id": str(workflow_id)} for step in spec.steps]
        cur.execute(q("job_enqueue"), {"jobs": json.dumps(rows), "actor": actor, "now": now})
    return workflow_id, True


def _load(cur, workflow_id: uuid.UUID) -> tuple[dict, list[dict]]:
    cur.execute(q("workflow_get"), {"id": workflow_id})
    workflow = cur.fetchone()
    if workflow is None:
        raise NotFound(f"workflow {workflow_id} not found")
    cur.execute(q("workflow_steps"), {"id": workflow_id})
    return workflow, cur.fetchall()


def _state(row: dict) -> dag.StepState:
    definition = dag.StepDef(
        name=row["step"], type=row["step_type"] or "task", task=row["task"],
        depends_on=tuple(row["depends_on"] or ()), when=row["condition"],
        on_failure=row["on_failure"], seconds=row["sleep_seconds"])
    return dag.StepState(definition, row["status"], row["result"], row["last_error"])


def advance(conn, workflow_ids: list[uuid.UUID], *, now: datetime | None = None,
            actor: str = "system") -> None:
    """Apply the DAG rules to workflows whose rows the caller has locked."""
    clock = now or datetime.now(timezone.utc)
    with conn.cursor(row_factory=dict_row) as cur:
        for workflow_id in workflow_ids:
            workflow, steps = _load(cur, workflow_id)
            if workflow["status"] in WORKFLOW_FINISHED:
                continue
            verdict = dag.evaluate({row["step"]: _state(row) for row in steps})
            by_name = {row["step"]: row for row in steps}
            events = [_decision_event(by_name[d.step], d, workflow_id, clock)
                      for d in verdict.decisions]
            if verdict.workflow_event:
                data = {"error": verdict.error} if verdict.error else {}
                events.append(NewEvent(stream_type="workflow", stream_id=workflow_id,
                                       version=workflow["version"] + 1,
                                       type=verdict.workflow_event, data=data,
                                       tags=workflow["tags"], workflow_id=workflow_id))
            store.append(conn, events, actor=actor, now=now)


def _decision_event(row: dict, decision: dag.Decision, workflow_id: uuid.UUID,
                    now: datetime) -> NewEvent:
    data = dict(decision.data)
    if decision.event_type == ev.STEP_UNBLOCKED:
        step_type = row["step_type"] or "task"
        if step_type == "task":
            data.update(status="pending", run_at=now.isoformat())
        else:
            data.update(status="waiting", run_at=_wait_until(
                step_type, row["sleep_seconds"], row["timeout_seconds"], now))
    return NewEvent(stream_type="job", stream_id=row["id"], version=row["version"] + 1,
                    type=decision.event_type, data=data, tags=row["tags"],
                    workflow_id=workflow_id)


def _lock_workflow(cur, workflow_id: uuid.UUID) -> dict:
    cur.execute(q("workflow_lock"), {"ids": [workflow_id]})
    row = cur.fetchone()
    if row is None:
        raise NotFound(f"workflow {workflow_id} not found")
    return row


def trigger(conn, workflow_id: uuid.UUID, step: str, payload: dict[str, Any] | None = None,
            *, actor: str = "api", now: datetime | None = None) -> None:
    """Complete a waiting wait_for_trigger step with `payload` as its output."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        _lock_workflow(cur, workflow_id)
        _, steps = _load(cur, workflow_id)
        row = next((r for r in steps if r["step"] == step), None)
        if row is None:
            raise NotFound(f"workflow {workflow_id} has no step '{step}'")
        if row["step_type"] != "wait_for_trigger" or row["status"] != "waiting":
            raise Conflict(f"step '{step}' is {row['status']}"
                           + ("" if row["step_type"] == "wait_for_trigger"
                              else f" and is a {row['step_type'] or 'task'} step")
                           + "; only a waiting wait_for_trigger step can be triggered")
        store.append(conn, [NewEvent(stream_type="job", stream_id=row["id"],
                                     version=row["version"] + 1, type=ev.TRIGGERED,
                                     data={"payload": payload or {}}, tags=row["tags"],
                                     workflow_id=workflow_id)], actor=actor, now=now)
        advance(conn, [workflow_id], now=now, actor=actor)


def cancel(conn, workflow_id: uuid.UUID, *, actor: str = "api",
           now: datetime | None = None) -> None:
    """Cancel every unfinished step (running ones stop at their next heartbeat), then the workflow."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        locked = _lock_workflow(cur, workflow_id)
        if locked["status"] in WORKFLOW_FINISHED:
            raise Conflict(f"workflow {workflow_id} is already {locked['status']}")
        workflow, steps = _load(cur, workflow_id)
        open_ids = sorted(r["id"] for r in steps if r["status"] in JOB_ACTIVE)
        cur.execute(q("job_lock"), {"ids": open_ids})
        events = [NewEvent(stream_type="job", stream_id=r["id"], version=r["version"] + 1,
                           type=ev.CANCELLED, data={"reason": "workflow cancelled"},
                           tags=r["tags"], workflow_id=workflow_id)
                  for r in cur.fetchall() if r["status"] in JOB_ACTIVE]
        events.append(NewEvent(stream_type="workflow", stream_id=workflow_id,
                               version=workflow["version"] + 1, type=ev.WORKFLOW_CANCELLED,
                               data={}, tags=workflow["tags"], workflow_id=workflow_id))
        store.append(conn, events, actor=actor, now=now)


def fire_timers(conn, *, now: datetime | None = None, limit: int = 100,
                actor: str = "monitor") -> int:
    """End due sleep steps and time out trigger waits; returns how many fired."""
    clock = now or datetime.now(timezone.utc)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("job_due_timers"), {"now": clock, "limit": limit})
        due = cur.fetchall()
    fired = 0
    for timer in due:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            _lock_workflow(cur, timer["workflow_id"])
            cur.execute(q("job_lock"), {"ids": [timer["id"]]})
            row = cur.fetchone()
            if row is None or row["status"] != "waiting" or row["run_at"] > clock:
                continue  # triggered or cancelled meanwhile
            base = dict(stream_type="job", stream_id=row["id"], tags=row["tags"],
                        workflow_id=row["workflow_id"])
            if row["step_type"] == "sleep":
                events = [NewEvent(**base, version=row["version"] + 1, type=ev.SUCCEEDED,
                                   data={"result": {"slept_seconds": row["sleep_seconds"]}})]
            else:
                error = f"trigger wait timed out after {row['timeout_seconds']:g}s"
                events = [
                    NewEvent(**base, version=row["version"] + 1, type=ev.FAILED,
                             data={"attempt": row["attempts"], "reason": "timeout", "error": error}),
                    NewEvent(**base, version=row["version"] + 2, type=ev.DEAD_LETTERED,
                             data={"attempt": row["attempts"], "error": error}),
                ]
            store.append(conn, events, actor=actor, now=now)
            advance(conn, [row["workflow_id"]], now=now, actor=actor)
            fired += 1
    return fired


def find(conn, *, external_id: str) -> uuid.UUID:
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(q("workflow_by_external_id"), {"external_id": external_id})
        row = cur.fetchone()
    if row is None:
        raise NotFound(f"workflow {external_id} not found")
    return row[0]
