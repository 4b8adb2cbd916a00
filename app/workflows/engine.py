"""Advance workflows: apply the DAG rules (qforge.workflows.dag) to locked workflows and append what they decide.

Everything that finishes a step (a completion, a failure that dead-letters, a
cancel, a trigger, a timer) calls `advance` in its own transaction, after
locking the step's workflow: the one lock order that keeps two steps finishing
at once from unblocking their dependent twice.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from psycopg.rows import dict_row

from qforge.workflows import subflows
from qforge.workflows import dag
from qforge.commands.errors import NotFound
from qforge.workflows.fanout import Fanout
from qforge.events import store
from qforge.events import types as ev
from qforge.events.states import PENDING, WAITING, WORKFLOW_FINISHED
from qforge.events.types import NewEvent
from qforge.settings import get_settings
from qforge.workflows import durable
from qforge import tracing
from qforge.sql import q

# A trigger wait without timeout never fires (PostgreSQL's 'infinity' would not load in Python).
NEVER = datetime(9999, 12, 31, tzinfo=timezone.utc)
MAX_ROUNDS = 1000


def wait_until(step_type: str, seconds: float | None, timeout: float | None, now: datetime) -> datetime:
    """When a wait step's timer fires: a sleep ends, a trigger wait times out (or never)."""
    delay = seconds if step_type == "sleep" else timeout
    return NEVER if delay is None else now + timedelta(seconds=delay)


def load(cur, workflow_id: uuid.UUID, *, elements: bool = True) -> tuple[dict, list[dict]]:
    """The workflow's row and its steps' job rows (with the elements of fan-out steps, unless
    elements=False)."""
    cur.execute(q("workflow_get"), {"id": workflow_id})
    workflow = cur.fetchone()
    if workflow is None:
        raise NotFound(f"workflow {workflow_id} not found")
    cur.execute(q("workflow_steps" if elements else "workflow_step_rows"), {"id": workflow_id})
    return workflow, cur.fetchall()


def step_state(row: dict) -> dag.StepState:
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
            # A fan-out step can end in the round that starts it (an empty or bad list):
            # the rules then look again, a bounded number of times (each round ends a step).
            for _ in range(MAX_ROUNDS):
                workflow, steps = load(cur, workflow_id, elements=False)
                if workflow.get("code") and workflow["status"] not in WORKFLOW_FINISHED:
                    if durable.advance_code(conn, cur, workflow, steps, clock, now=now, actor=actor) \
                            and workflow.get("parent_job_id"):
                        _tell_parent(conn, workflow_id, actor=actor, now=now)
                    break
                if workflow["status"] in WORKFLOW_FINISHED or not _round(conn, cur, workflow, steps, clock,
                                                                         now, actor):
                    break


def split_elements(rows: list[dict]) -> tuple[list[dict], dict[str, list[dict]]]:
    """A workflow's job rows: its steps, and the elements of each fan-out step."""
    steps = [row for row in rows if not row.get("element_of")]
    elements: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("element_of"):
            elements.setdefault(row["element_of"], []).append(row)
    return steps, elements


def _round(conn, cur, workflow: dict, steps: list[dict], clock: datetime, now: datetime | None,
           actor: str) -> bool:
    """One evaluation and its events; True when a step ended in it and the rules must look again."""
    workflow_id = workflow["id"]
    specs = {s.get("step"): s for s in workflow.get("definition") or [] if isinstance(s, dict)}
    verdict = dag.evaluate({row["step"]: step_state(row) for row in steps})
    by_name = {row["step"]: row for row in steps}
    fan = Fanout(cur, workflow_id, clock)
    events = []
    for decision in verdict.decisions:
        row, spec = by_name[decision.step], specs.get(decision.step) or {}
        if decision.event_type == ev.StepUnblocked.type and spec.get("for_each"):
            settings = get_settings()
            fan.start(row, spec, decision.data.get("inputs", {}),
                      by_name[spec["for_each"]["step"]]["result"], settings.max_fan_out,
                      settings.max_workflow_jobs, settings.max_fan_out_bytes)
        elif decision.event_type == ev.StepUnblocked.type and row["step_type"] == "workflow":
            fan.again |= _start_child(conn, workflow, row, spec, decision.data.get("inputs", {}),
                                      events, actor=actor, now=now)
        else:
            events.append(_decision_event(row, decision, workflow_id, clock))
    for row in steps:
        spec = specs.get(row["step"]) or {}
        if row["status"] == WAITING and spec.get("for_each"):
            fan.progress(row, spec)
    events += fan.events
    if verdict.workflow_event and not fan.again:
        data: ev.EventData = (ev.WorkflowFailed(error=verdict.error)
                              if verdict.workflow_event == ev.WorkflowFailed.type
                              else ev.WorkflowSucceeded(result=_result(workflow, by_name)))
        events.append(NewEvent(stream_id=workflow_id, version=workflow["version"] + 1,
                               data=data, tags=workflow["tags"], workflow_id=workflow_id))
    store.append(conn, events, actor=actor, now=now)
    if verdict.workflow_event and not fan.again:
        tracing.ended(next((row["trace"] for row in steps if row.get("trace")), None), "qforge.workflow.end",
                      workflow_id=workflow_id, status="failed" if verdict.workflow_event == ev.WorkflowFailed.type
                      else "succeeded", error=verdict.error)
    if verdict.workflow_event and not fan.again and workflow.get("parent_job_id"):
        _tell_parent(conn, workflow["id"], actor=actor, now=now)
    return fan.again


def _start_child(conn, workflow: dict, row: dict, spec: dict[str, Any], inputs: dict[str, Any],
                 events: list[NewEvent], *, actor: str, now: datetime | None) -> bool:
    """A workflow step was unblocked: it waits for the child it starts (or dies at once if the
    child cannot start); True when it ended."""
    base: dict[str, Any] = dict(stream_id=row["id"], tags=row["tags"], workflow_id=workflow["id"])
    store.append(conn, [NewEvent(**base, version=row["version"] + 1,
                                 data=ev.StepUnblocked(status=WAITING, run_at=NEVER, inputs=inputs))],
                 actor=actor, now=now)
    child, problem = subflows.start_child(conn, row, spec, inputs, workflow, actor=actor, now=now)
    if problem is None:
        return False
    events.append(NewEvent(**base, version=row["version"] + 2,
                           data=ev.Failed(attempt=0, reason="child_workflow", error=problem)))
    events.append(NewEvent(**base, version=row["version"] + 3, data=ev.DeadLettered(attempt=0, error=problem)))
    return True


def _tell_parent(conn, workflow_id: uuid.UUID, *, actor: str, now: datetime | None) -> None:
    """A sub-workflow just ended: end its parent's step now if the parent is free (see subflows)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("workflow_get"), {"id": workflow_id})
        subflows.finish_parent(conn, cur.fetchone(), wait=False, actor=actor, now=now)


def _result(workflow: dict, by_name: dict[str, dict]) -> Any:
    """What the workflow's `result` names: a step's output, at a path (None for a skipped step)."""
    source = workflow.get("result_from")
    if not source or source.get("step") not in by_name:
        return None
    return dag.read_path(by_name[source["step"]]["result"], source.get("path"))


def _decision_event(row: dict, decision: dag.Decision, workflow_id: uuid.UUID,
                    now: datetime) -> NewEvent:
    data: ev.EventData
    if decision.event_type == ev.StepUnblocked.type:
        step_type = row["step_type"] or "task"
        extra: dict[str, Any] = decision.data
        if step_type == "task":
            data = ev.StepUnblocked(status=PENDING, run_at=now, **extra)
        else:
            data = ev.StepUnblocked(status=WAITING, run_at=wait_until(
                step_type, row["sleep_seconds"], row["timeout_seconds"], now), **extra)
    else:
        data = ev.Skipped(**decision.data)
    return NewEvent(stream_id=row["id"], version=row["version"] + 1, data=data, tags=row["tags"],
                    workflow_id=workflow_id)
