"""Workflow commands: submit, trigger, cancel, fire timers (advancing lives in qforge.workflows.engine)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from psycopg.rows import dict_row, tuple_row

from qforge.workflows import subflows
from qforge.workflows import dag
from qforge.workflows.engine import advance, load, wait_until
from qforge.commands.enqueue import job_row
from qforge.commands.errors import Conflict, Invalid, NotFound
from qforge.commands.plan import Plan, Statement, run
from qforge.commands.specs import StepSpec, WorkflowSpec
from qforge.events import store
from qforge.events import types as ev
from qforge.events.ids import new_id
from qforge.events.states import JOB_ACTIVE, RUNNING, WAITING, WORKFLOW_FINISHED
from qforge.events.types import NewEvent
from qforge import tracing
from qforge.sql import q
from qforge.workflows.submitted import store_submitted


def _step_data(step: StepSpec, handlers: dict[str, list[str]], now: datetime,
               trace: dict[str, str] | None = None) -> ev.Enqueued:
    definition = step.definition()
    status = dag.initial_status(definition, handlers)
    run_at = wait_until(step.type, step.seconds, step.timeout_seconds, now) if status == WAITING else None
    return ev.Enqueued(task=step.task or step.type, queue=step.queue, priority=step.priority,
                       max_retries=step.max_retries, run_at=run_at, payload=step.payload,
                       status=status, timeout_seconds=step.timeout_seconds, step=step.step,
                       step_type=step.type, depends_on=list(definition.dependencies()),
                       when=definition.when, on_failure=step.on_failure, seconds=step.seconds,
                       concurrency_key=step.concurrency_key, concurrency_limit=step.concurrency_limit,
                       fairness_key=step.fairness_key,
                       backoff_base_seconds=step.backoff_base_seconds,
                       backoff_cap_seconds=step.backoff_cap_seconds, trace=trace)


def submit(conn, spec: WorkflowSpec, *, actor: str = "api", now: datetime | None = None,
           external_id: str | None = None,
           definition: dict[str, Any] | None = None,
           parent: dict[str, Any] | None = None,
           trace_parent: dict[str, str] | None = None) -> tuple[uuid.UUID, bool]:
    """Check the graph (every problem at once: Invalid), then store the workflow and its steps; (id, created).

    `external_id` is the id another system knows the workflow by (the pod
    orchestrator's workflowId); `definition` ({"name", "version"}) the stored
    definition it runs; `parent` ({"workflow_id", "step", "job_id", "depth"}) the
    step of another workflow that started it (qforge.workflows.subflows), and `trace_parent` the
    stored trace context its qforge.submit span is a child of (the parent step's; else the
    caller's current span)."""
    with conn.transaction(), tracing.span("qforge.submit", parent=trace_parent, **span_values(spec, definition)
                                          ) as traced:
        workflow_id, created = run(conn, submit_plan(spec, actor=actor, now=now, external_id=external_id,
                                                     definition=definition, parent=parent, trace=traced.carrier))
        traced.set(workflow_id=workflow_id)
        if created and starts_children(spec):
            advance(conn, [workflow_id], now=now, actor=actor)  # start root sub-workflows now
    return workflow_id, created


def span_values(spec: WorkflowSpec, definition: dict[str, Any] | None = None) -> dict[str, Any]:
    """The qforge.submit span's attributes."""
    return {"workflow": spec.name, "steps": len(spec.steps),
            "definition": definition["name"] if definition else None,
            "definition_version": definition["version"] if definition else None}


def starts_children(spec: WorkflowSpec) -> bool:
    """Does the workflow start steps by the rules at once (sub-workflows), beyond storing them?"""
    return any(step.type in dag.STARTED_BY_THE_RULES for step in spec.steps)


def submit_plan(spec: WorkflowSpec, *, actor: str = "api", now: datetime | None = None,
                external_id: str | None = None, definition: dict[str, Any] | None = None,
                parent: dict[str, Any] | None = None,
                trace: dict[str, str] | None = None) -> Plan[tuple[uuid.UUID, bool]]:
    """submit()'s statements as a plan (qforge.commands.plan), for qforge.submit in the caller's
    transaction too; submit() then starts root sub-workflows (starts_children). `trace`: the
    submit span's context, stored in every step (their runs are its children)."""
    problems = spec.problems()
    wanted = sorted({s.definition_name for s in spec.steps if s.type == "workflow" and s.definition_name})
    if wanted:  # workflow steps naming stored definitions that do not exist
        [known_rows] = yield [Statement(q("definitions_known"), {"names": wanted}, fetch=True)]
        known = {row[0] for row in known_rows}
        problems += [f"step '{s.step}': unknown definition '{s.definition_name}'" for s in spec.steps
                     if s.type == "workflow" and s.definition_name and s.definition_name not in known]
    if parent and parent.get("depth", 1) > MAX_NESTING:
        problems.append(f"sub-workflows nest more than {MAX_NESTING} deep (a definition that starts itself?)")
    if problems:
        raise Invalid("invalid workflow: " + "; ".join(problems), problems)
    clock = now or datetime.now(timezone.utc)
    workflow_id = new_id()
    handlers = dag.handlers_of(s.definition() for s in spec.steps)
    submitted = ev.WorkflowSubmitted(
        name=spec.name, idempotency_key=spec.idempotency_key, external_id=external_id,
        steps=[s.model_dump(mode="json", by_alias=True, exclude_none=True) for s in spec.steps],
        result=spec.result.model_dump(exclude_none=True) if spec.result else None,
        deadline_seconds=spec.deadline_seconds, definition=definition, parent=parent,
        deadline_at=(clock + timedelta(seconds=spec.deadline_seconds)
                     if spec.deadline_seconds is not None else None))
    existing = yield from store_submitted(workflow_id, submitted, spec.tags, actor=actor, now=now)
    if existing is not None:
        return existing, False
    rows = [job_row(new_id(), _step_data(step, handlers, clock, trace), spec.tags, workflow_id)
            for step in spec.steps]
    yield [Statement(q("job_enqueue"), {"jobs": json.dumps(rows), "actor": actor, "now": now})]
    return workflow_id, True


MAX_NESTING = 10  # sub-workflows within sub-workflows


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
        _, steps = load(cur, workflow_id)
        row = next((r for r in steps if r["step"] == step), None)
        if row is None:
            raise NotFound(f"workflow {workflow_id} has no step '{step}'")
        if row["step_type"] != "wait_for_trigger" or row["status"] != WAITING:
            raise Conflict(f"step '{step}' is {row['status']}"
                           + ("" if row["step_type"] == "wait_for_trigger"
                              else f" and is a {row['step_type'] or 'task'} step")
                           + "; only a waiting wait_for_trigger step can be triggered")
        store.append(conn, [NewEvent(stream_id=row["id"], version=row["version"] + 1,
                                     data=ev.Triggered(payload=payload or {}), tags=row["tags"],
                                     workflow_id=workflow_id)], actor=actor, now=now)
        advance(conn, [workflow_id], now=now, actor=actor)


def cancel(conn, workflow_id: uuid.UUID, *, actor: str = "api",
           now: datetime | None = None) -> None:
    """Cancel every unfinished step (running ones stop at their next heartbeat), then the workflow."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        locked = _lock_workflow(cur, workflow_id)
        if locked["status"] in WORKFLOW_FINISHED:
            raise Conflict(f"workflow {workflow_id} is already {locked['status']}")
        workflow, steps = load(cur, workflow_id)
        open_ids = sorted(r["id"] for r in steps if r["status"] in JOB_ACTIVE)
        cur.execute(q("job_lock"), {"ids": open_ids})
        events = [NewEvent(stream_id=r["id"], version=r["version"] + 1,
                           data=ev.Cancelled(reason="workflow cancelled"),
                           tags=r["tags"], workflow_id=workflow_id)
                  for r in cur.fetchall() if r["status"] in JOB_ACTIVE]
        events.append(NewEvent(stream_id=workflow_id, version=workflow["version"] + 1,
                               data=ev.WorkflowCancelled(), tags=workflow["tags"],
                               workflow_id=workflow_id))
        store.append(conn, events, actor=actor, now=now)
        _end_children_and_tell_parent(conn, cur, workflow, actor=actor, now=now)
        tracing.ended(next((r["trace"] for r in steps if r.get("trace")), None), "qforge.workflow.end",
                      workflow_id=workflow_id, status="cancelled")


def _end_children_and_tell_parent(conn, cur, workflow: dict, *, actor: str, now: datetime | None) -> None:
    """A workflow just ended (cancel, deadline): cancel its running sub-workflows (their ids
    sort after its own, the lock order), and end its own parent's step if it is a child."""
    for child_id in subflows.children_to_cancel(cur, workflow["id"]):
        try:
            cancel(conn, child_id, actor=actor, now=now)
        except Conflict:
            pass  # it ended meanwhile
    if workflow.get("parent_job_id"):
        cur.execute(q("workflow_get"), {"id": workflow["id"]})
        subflows.finish_parent(conn, cur.fetchone(), wait=False, actor=actor, now=now)


def fire_timers(conn, *, now: datetime | None = None, limit: int = 100,
                actor: str = "monitor") -> int:
    """End due sleep steps and time out trigger waits; returns how many fired.

    A trigger wait that times out is the other place where a step becomes
    dead (the first is job_fail, for a worker's failed attempt)."""
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
            if row is None or row["status"] != WAITING or row["run_at"] > clock:
                continue  # triggered or cancelled meanwhile
            base: dict[str, Any] = dict(stream_id=row["id"], tags=row["tags"],
                                        workflow_id=row["workflow_id"])
            if row["step_type"] == "sleep":
                events = [NewEvent(**base, version=row["version"] + 1, data=ev.Succeeded(
                    result={"slept_seconds": row["sleep_seconds"]}))]
            else:
                error = f"trigger wait timed out after {row['timeout_seconds']:g}s"
                events = [
                    NewEvent(**base, version=row["version"] + 1, data=ev.Failed(
                        attempt=row["attempts"], reason="timeout", error=error)),
                    NewEvent(**base, version=row["version"] + 2, data=ev.DeadLettered(
                        attempt=row["attempts"], error=error)),
                ]
            store.append(conn, events, actor=actor, now=now)
            advance(conn, [row["workflow_id"]], now=now, actor=actor)
            fired += 1
    return fired


def fire_deadlines(conn, *, now: datetime | None = None, limit: int = 100,
                   actor: str = "monitor") -> int:
    """Fail running workflows past their deadline; returns how many.

    Running steps are cancelled (their workers stop at the next heartbeat, as
    after a cancel), every other unfinished step is skipped, and the workflow
    fails with reason `deadline`, all in one transaction per workflow."""
    clock = now or datetime.now(timezone.utc)
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(q("workflow_due_deadlines"), {"now": clock, "limit": limit})
        due = [row[0] for row in cur.fetchall()]
    fired = 0
    for workflow_id in due:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            locked = _lock_workflow(cur, workflow_id)
            workflow, steps = load(cur, workflow_id)
            if locked["status"] in WORKFLOW_FINISHED or workflow["deadline_at"] > clock:
                continue  # finished or resumed meanwhile
            cur.execute(q("job_lock"), {"ids": sorted(r["id"] for r in steps if r["status"] in JOB_ACTIVE)})
            reason = f"deadline of {workflow['deadline_seconds']:g}s passed"
            events = [NewEvent(stream_id=r["id"], version=r["version"] + 1,
                               data=(ev.Cancelled(reason=f"workflow {reason}") if r["status"] == RUNNING
                                     else ev.Skipped(reason=f"workflow {reason}")),
                               tags=r["tags"], workflow_id=workflow_id)
                      for r in cur.fetchall() if r["status"] in JOB_ACTIVE]
            events.append(NewEvent(stream_id=workflow_id, version=workflow["version"] + 1,
                                   data=ev.WorkflowFailed(error=f"deadline: {reason}", reason="deadline"),
                                   tags=workflow["tags"], workflow_id=workflow_id))
            store.append(conn, events, actor=actor, now=now)
            _end_children_and_tell_parent(conn, cur, workflow, actor=actor, now=now)
            fired += 1
    return fired


def find(conn, *, external_id: str) -> uuid.UUID:
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(q("workflow_by_external_id"), {"external_id": external_id})
        row = cur.fetchone()
    if row is None:
        raise NotFound(f"workflow {external_id} not found")
    return row[0]
