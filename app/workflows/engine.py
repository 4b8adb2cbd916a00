"""The workflow engine: advance workflows, start and end their sub-workflows, fan-outs and definitions.

The one door: everything that finishes a step (a completion, a failure that
dead-letters, a cancel, a trigger, a timer, a deadline, a child workflow's end)
calls `engine.advance` in the same transaction, after locking the step's
workflow: the one lock order that keeps two steps finishing at once from
unblocking their dependent twice. `advance` applies the DAG rules
(qforge.workflows.dag) to the locked workflows and appends what they decide;
a code workflow goes to qforge.workflows.durable. The job cap every starter asks
is qforge.workflows.rows.over_job_cap; every event it writes for a step or a workflow comes
from a constructor of qforge.events.transitions (where a job becomes dead: job_died).

Below the engine (and never importing it): rows (load, lock, the job cap), fanout,
subflows (a child's outcome), submit (a plan, no advance), definitions, durable.
Above it: resume, the job commands (report, manage, bulk), the API and the monitor.
"""

from __future__ import annotations

import contextvars
import uuid
from datetime import datetime, timezone
from typing import Any

from psycopg.rows import dict_row, tuple_row

from qforge.commands.errors import CommandError, Conflict, Invalid, NotFound
from qforge.commands.specs import WorkflowSpec
from qforge.events import store
from qforge.events import types as ev
from qforge.events.states import (CANCELLED, FAILED, JOB_ACTIVE, PENDING, RUNNING, SUCCEEDED, WAITING,
                                  WORKFLOW_FINISHED)
from qforge.events.transitions import (after, job_cancelled, job_died, job_succeeded, step_skipped,
                                       step_triggered, step_unblocked, workflow_ended)
from qforge.events.types import NewEvent
from qforge.settings import get_settings
from qforge import tracing
from qforge.sql import q
from qforge.workflows import batch, dag, durable, subflows
from qforge.workflows.definitions import definition_workflow
from qforge.workflows.fanout import Fanout
from qforge.workflows.rows import NEVER, load, lock_workflow, over_job_cap, step_state, wait_until
from qforge.workflows.submit import starts_children, submitting

MAX_ROUNDS = 1000


def advance(conn, workflow_ids: list[uuid.UUID], *, now: datetime | None = None,
            actor: str = "system", loaded: dict[uuid.UUID, tuple[dict, list[dict]]] | None = None) -> None:
    """Apply the DAG rules to workflows whose rows the caller has locked. `loaded`: their rows as
    load(elements=False) reads them, read since they were locked and their steps reported
    (rows.load_many: one read for a batch of reports). Workflows alone in their tree write their
    new jobs in one statement at the end (batch.deferred_appends)."""
    outer = _LOADED.get() is None
    if outer:
        loaded = dict(loaded or {})
    else:  # a parent a child's end moved on (finish_parent): what the outer call read of it is stale
        loaded = _LOADED.get()
        for workflow_id in workflow_ids:
            loaded.pop(workflow_id, None)
    token = _LOADED.set(loaded) if outer else None
    try:
        if outer:
            with batch.deferred_appends(conn), batch.early_runs(loaded, workflow_ids, durable.wakes_inline):
                _advance_all(conn, workflow_ids, now=now, actor=actor, loaded=loaded)
        else:
            _advance_all(conn, workflow_ids, now=now, actor=actor, loaded={})
    finally:
        if token is not None:
            _LOADED.reset(token)


# The rows an outer advance read ahead and has not used yet (see advance).
_LOADED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("qforge_advance_loaded", default=None)


def _advance_all(conn, workflow_ids: list[uuid.UUID], *, now: datetime | None, actor: str,
                 loaded: dict[uuid.UUID, tuple[dict, list[dict]]]) -> None:
    clock = now or datetime.now(timezone.utc)
    with conn.cursor(row_factory=dict_row) as cur:
        for workflow_id in workflow_ids:
            # A fan-out step can end in the round that starts it (an empty or bad list):
            # the rules then look again, a bounded number of times (each round ends a step).
            for _ in range(MAX_ROUNDS):
                ahead = loaded.pop(workflow_id, None)
                workflow, steps = ahead if ahead is not None else load(cur, workflow_id, elements=False)
                if workflow.get("code") and workflow["status"] not in WORKFLOW_FINISHED:
                    if durable.advance_code(conn, cur, workflow, steps, clock, now=now, actor=actor,
                                            start_definition=start_definition) \
                            and workflow.get("parent_job_id"):
                        _tell_parent(conn, workflow_id, actor=actor, now=now)
                    break
                if workflow["status"] in WORKFLOW_FINISHED or not _round(conn, cur, workflow, steps, clock,
                                                                         now, actor):
                    break


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
                      settings.max_fan_out_bytes)
        elif decision.event_type == ev.StepUnblocked.type and row["step_type"] == "workflow":
            fan.again |= _start_step_child(conn, workflow, row, spec, decision.data.get("inputs", {}),
                                           events, actor=actor, now=now)
        else:
            events += _decision_events(row, decision, clock)
    for row in steps:
        spec = specs.get(row["step"]) or {}
        if row["status"] == WAITING and spec.get("for_each"):
            fan.progress(row, spec)
    events += fan.events
    if verdict.workflow_event and not fan.again:
        events += (workflow_ended(workflow, FAILED, error=verdict.error)
                   if verdict.workflow_event == ev.WorkflowFailed.type
                   else workflow_ended(workflow, SUCCEEDED, result=_result(workflow, by_name)))
    store.append(conn, events, actor=actor, now=now)
    if verdict.workflow_event and not fan.again:
        tracing.ended(next((row["trace"] for row in steps if row.get("trace")), None), "qforge.workflow.end",
                      workflow_id=workflow_id, status="failed" if verdict.workflow_event == ev.WorkflowFailed.type
                      else "succeeded", error=verdict.error)
    if verdict.workflow_event and not fan.again and workflow.get("parent_job_id"):
        _tell_parent(conn, workflow["id"], actor=actor, now=now)
    return fan.again


def _start_step_child(conn, workflow: dict, row: dict, spec: dict[str, Any], inputs: dict[str, Any],
                      events: list[NewEvent], *, actor: str, now: datetime | None) -> bool:
    """A workflow step was unblocked: it waits for the child it starts (or dies at once if the
    child cannot start); True when it ended."""
    unblocked = step_unblocked(row, WAITING, NEVER, inputs=inputs)
    store.append(conn, unblocked, actor=actor, now=now)
    child, problem = start_child(conn, row, spec, inputs, workflow, actor=actor, now=now)
    if problem is None:
        return False
    events += job_died(after(row, unblocked), "child_workflow", problem, attempt=0)
    return True


def _tell_parent(conn, workflow_id: uuid.UUID, *, actor: str, now: datetime | None) -> None:
    """A sub-workflow just ended: end its parent's step now if the parent is free (see subflows)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("workflow_get"), {"id": workflow_id})
        finish_parent(conn, cur.fetchone(), wait=False, actor=actor, now=now)


def _result(workflow: dict, by_name: dict[str, dict]) -> Any:
    """What the workflow's `result` names: a step's output, at a path (None for a skipped step)."""
    source = workflow.get("result_from")
    if not source or source.get("step") not in by_name:
        return None
    return dag.read_path(by_name[source["step"]]["result"], source.get("path"))


def _decision_events(row: dict, decision: dag.Decision, now: datetime) -> list[NewEvent]:
    if decision.event_type == ev.StepUnblocked.type:
        step_type = row["step_type"] or "task"
        if step_type == "task":
            return step_unblocked(row, PENDING, now, **decision.data)
        return step_unblocked(row, WAITING, wait_until(step_type, row["sleep_seconds"], row["timeout_seconds"], now),
                              **decision.data)
    return step_skipped(row, **decision.data)


def start_child(conn, row: dict, spec: dict[str, Any], inputs: dict[str, Any], workflow: dict,
                *, actor: str, now: datetime | None) -> tuple[uuid.UUID | None, str | None]:
    """Submit the child of a workflow step that was just unblocked (qforge.workflows.subflows);
    (child id, None) or (None, why not)."""
    child_inputs = {**inputs, **(spec.get("inputs") or {})}
    try:
        with conn.transaction():  # a child over the tree's budget is taken back whole
            child = start_definition(conn, spec["definition"], child_inputs, actor=actor, now=now,
                                     parent={"workflow_id": str(workflow["id"]), "step": row["step"],
                                             "job_id": str(row["id"]),
                                             "depth": (workflow.get("nesting") or 0) + 1},
                                     trace_parent=row.get("trace"))
            # Sub-workflows share their root's budget (see over_job_cap).
            with conn.cursor(row_factory=dict_row) as cur:
                over = over_job_cap(cur, child)
            if over is not None:
                raise Invalid(f"its jobs would make the workflow's tree {over[0]} jobs, more than"
                              f" QFORGE_MAX_WORKFLOW_JOBS ({over[1]})")
    except CommandError as error:
        return None, f"could not start a workflow of definition '{spec['definition']}': {error}"
    return child, None


def finish_parent(conn, child: dict, *, wait: bool, actor: str, now: datetime | None) -> bool:
    """End the parent step of a finished child; True when done (or nothing to do). With
    wait=False it gives up when the parent is locked (the caller holds the child's lock)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("workflow_lock" if wait else "workflow_lock_unless_busy"),
                    {"ids": [child["parent_workflow_id"]]})
        if cur.fetchone() is None:
            return False
        cur.execute(q("job_lock"), {"ids": [child["parent_job_id"]]})
        step = cur.fetchone()
        outcome = subflows.child_outcome(child)
        if step is None or step["status"] != WAITING or outcome is None:
            return True
        events = (job_died(step, outcome.reason, outcome.error, attempt=outcome.attempt)
                  if isinstance(outcome, ev.Failed) else job_succeeded(step, outcome.result))
        store.append(conn, events, actor=actor, now=now)
        advance(conn, [step["workflow_id"]], now=now, actor=actor)
        return True


def finish_parents(conn, *, now: datetime | None = None, limit: int = 100, actor: str = "monitor") -> int:
    """The monitor's part: end parent steps whose child ended; how many."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("workflow_children_done"), {"limit": limit})
        children = cur.fetchall()
    for child in children:
        with conn.transaction():
            finish_parent(conn, child, wait=True, actor=actor, now=now)
    return len(children)


def start_definition(conn, name: str, inputs: dict[str, Any] | None, *, actor: str,
                     idempotency_key: str | None = None, tags: dict[str, str] | None = None,
                     now: datetime | None = None, parent: dict[str, Any] | None = None,
                     version: int | None = None, trace_parent: dict[str, str] | None = None) -> uuid.UUID:
    """Start a workflow of `version` of the stored definition `name` (the latest without it); its
    id, the workflow recording the version it runs. NotFound for an unknown definition or version,
    Invalid for inputs that are not a JSON object or make no valid workflow."""
    spec, definition = definition_workflow(conn, name, inputs, version=version, tags=tags,
                                           idempotency_key=idempotency_key)
    workflow_id, _ = submit(conn, spec, actor=actor, now=now, definition=definition, parent=parent,
                            trace_parent=trace_parent)
    return workflow_id


def submit(conn, spec: WorkflowSpec, *, actor: str = "api", now: datetime | None = None,
           external_id: str | None = None, definition: dict[str, Any] | None = None,
           parent: dict[str, Any] | None = None,
           trace_parent: dict[str, str] | None = None) -> tuple[uuid.UUID, bool]:
    """Store a workflow and its steps (qforge.workflows.submit.submitting: its arguments), then
    start its root sub-workflows in the same transaction; (id, created)."""
    with submitting(conn, spec, actor=actor, now=now, external_id=external_id, definition=definition,
                    parent=parent, trace_parent=trace_parent) as (workflow_id, created):
        if created and starts_children(spec):
            advance(conn, [workflow_id], now=now, actor=actor)  # start root sub-workflows now
    return workflow_id, created


def trigger(conn, workflow_id: uuid.UUID, step: str, payload: dict[str, Any] | None = None,
            *, actor: str = "api", now: datetime | None = None) -> None:
    """Complete a waiting wait_for_trigger step with `payload` as its output."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        lock_workflow(cur, workflow_id)
        _, steps = load(cur, workflow_id)
        row = next((r for r in steps if r["step"] == step), None)
        if row is None:
            raise NotFound(f"workflow {workflow_id} has no step '{step}'")
        if row["step_type"] != "wait_for_trigger" or row["status"] != WAITING:
            raise Conflict(f"step '{step}' is {row['status']}"
                           + ("" if row["step_type"] == "wait_for_trigger"
                              else f" and is a {row['step_type'] or 'task'} step")
                           + "; only a waiting wait_for_trigger step can be triggered")
        store.append(conn, step_triggered(row, payload or {}), actor=actor, now=now)
        advance(conn, [workflow_id], now=now, actor=actor)


def cancel(conn, workflow_id: uuid.UUID, *, actor: str = "api",
           now: datetime | None = None) -> None:
    """Cancel every unfinished step (running ones stop at their next heartbeat), then the workflow."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        locked = lock_workflow(cur, workflow_id)
        if locked["status"] in WORKFLOW_FINISHED:
            raise Conflict(f"workflow {workflow_id} is already {locked['status']}")
        workflow, steps = load(cur, workflow_id)
        open_ids = sorted(r["id"] for r in steps if r["status"] in JOB_ACTIVE)
        cur.execute(q("job_lock"), {"ids": open_ids})
        events = [event for r in cur.fetchall() if r["status"] in JOB_ACTIVE
                  for event in job_cancelled(r, "workflow cancelled")]
        events += workflow_ended(workflow, CANCELLED)
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
        finish_parent(conn, cur.fetchone(), wait=False, actor=actor, now=now)


def fire_timers(conn, *, now: datetime | None = None, limit: int = 100,
                actor: str = "monitor") -> int:
    """End due sleep steps and time out trigger waits; returns how many fired.

    A trigger wait that times out dies (transitions.job_died)."""
    clock = now or datetime.now(timezone.utc)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("job_due_timers"), {"now": clock, "limit": limit})
        due = cur.fetchall()
    fired = 0
    for timer in due:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            lock_workflow(cur, timer["workflow_id"])
            cur.execute(q("job_lock"), {"ids": [timer["id"]]})
            row = cur.fetchone()
            if row is None or row["status"] != WAITING or row["run_at"] > clock:
                continue  # triggered or cancelled meanwhile
            if row["step_type"] == "sleep":
                events = job_succeeded(row, {"slept_seconds": row["sleep_seconds"]})
            else:
                events = job_died(row, "timeout", f"trigger wait timed out after {row['timeout_seconds']:g}s",
                                  attempt=row["attempts"])
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
            locked = lock_workflow(cur, workflow_id)
            workflow, steps = load(cur, workflow_id)
            if locked["status"] in WORKFLOW_FINISHED or workflow["deadline_at"] > clock:
                continue  # finished or resumed meanwhile
            cur.execute(q("job_lock"), {"ids": sorted(r["id"] for r in steps if r["status"] in JOB_ACTIVE)})
            reason = f"deadline of {workflow['deadline_seconds']:g}s passed"
            events = [event for r in cur.fetchall() if r["status"] in JOB_ACTIVE
                      for event in (job_cancelled(r, f"workflow {reason}") if r["status"] == RUNNING
                                    else step_skipped(r, f"workflow {reason}"))]
            events += workflow_ended(workflow, FAILED, error=f"deadline: {reason}", reason="deadline")
            store.append(conn, events, actor=actor, now=now)
            _end_children_and_tell_parent(conn, cur, workflow, actor=actor, now=now)
            fired += 1
    return fired
