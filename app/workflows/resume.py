"""Resume a workflow from where it failed: reopen its dead, cancelled and skipped steps, keep every success.

Two ways in: `resume` (POST /workflows/{id}/resume) reopens every such step of
a failed or cancelled workflow; `reopen_step` (an operator's retry of one dead
or cancelled step, POST /jobs/{id}/retry) reopens that step and what its end
skipped or cancelled downstream, and re-opens the workflow if it had ended.
In the log a resume is one WorkflowResumed (naming the reopened steps)
followed, in the same transaction, by one StepReopened per step; the DAG rules
then unblock them as on the first run (qforge.workflows.engine).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

from psycopg.rows import dict_row

from qforge.workflows import dag
from qforge.workflows.engine import advance
from qforge.workflows.rows import load, lock_workflow, split_elements, step_state, wait_until
from qforge.commands.errors import Conflict
from qforge.events import store
from qforge.events import types as ev
from qforge.events.states import BLOCKED, CANCELLED, DEAD, RUNNING, SKIPPED, WAITING, WORKFLOW_FINISHED, allows
from qforge.events.transitions import step_reopened, workflow_resumed
from qforge.events.types import NewEvent
from qforge.sql import q
from qforge.workflows import durable

# What a resume runs again: every step that ended without succeeding.
REOPENABLE = frozenset({DEAD, CANCELLED, SKIPPED})


def steps_to_reopen(states: dict[str, dag.StepState], seeds: set[str]) -> list[str]:
    """The seeds and, transitively, the reopenable steps downstream of them (their
    dependents and failure handlers), in declared order: a pure rule, tested directly."""
    chosen = {name for name in seeds if states[name].status in REOPENABLE}
    changed = True
    while changed:
        changed = False
        for name, state in states.items():
            if name in chosen or state.status not in REOPENABLE:
                continue
            handled = [h for h, s in states.items() if s.definition.on_failure == name]
            if set(state.definition.dependencies()) & chosen or set(handled) & chosen:
                chosen.add(name)
                changed = True
    return [name for name in states if name in chosen]


def resume(conn, workflow_id: uuid.UUID, *, actor: str = "api", now: datetime | None = None) -> list[str]:
    """Run a failed or cancelled workflow's unsuccessful steps again; the names of the reopened steps."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        lock_workflow(cur, workflow_id)
        workflow, rows = load(cur, workflow_id)
        if not allows("workflow", workflow["status"], ev.WorkflowResumed.type):
            raise Conflict(f"workflow {workflow_id} is {workflow['status']};"
                           " only a failed or cancelled workflow can be resumed")
        if workflow.get("code"):
            return durable.resume_code(conn, cur, workflow, rows, actor=actor, now=now)
        states = {row["step"]: step_state(row) for row in split_elements(rows)[0]}
        names = steps_to_reopen(states, set(states))
        _reopen(conn, cur, workflow, rows, names, "resume", actor=actor, now=now)
        return names


def reopen_step(conn, cur, workflow_id: uuid.UUID, step: str, *, actor: str,
                now: datetime | None, batch_id: uuid.UUID | None = None) -> list[str]:
    """Within the caller's transaction (workflow and job locked, in that order): reopen one dead
    or cancelled step and what it took down with it; the workflow too, if it had failed or was
    cancelled (409 for a succeeded one: nothing of it is left to run)."""
    workflow, rows = load(cur, workflow_id)
    if workflow.get("code"):  # a code workflow's steps run again only with the whole workflow
        if not allows("workflow", workflow["status"], ev.WorkflowResumed.type):
            raise Conflict(f"step '{step}' belongs to code workflow {workflow_id}, which is {workflow['status']};"
                           " its steps run again when the workflow is resumed after it failed")
        return durable.resume_code(conn, cur, workflow, rows, actor=actor, now=now)
    if workflow["status"] in WORKFLOW_FINISHED \
            and not allows("workflow", workflow["status"], ev.WorkflowResumed.type):
        raise Conflict(f"step '{step}' belongs to workflow {workflow_id}, which {workflow['status']};"
                       " a finished workflow is only re-opened when it failed or was cancelled")
    steps, elements = split_elements(rows)
    states = {row["step"]: step_state(row) for row in steps}
    element = next((row for rows_ in elements.values() for row in rows_ if row["step"] == step), None)
    if element is not None:  # an element runs again as part of its fan-out step
        step = element["element_of"]
    names = steps_to_reopen(states, {step})
    _reopen(conn, cur, workflow, rows, names, f"retry of step '{step}'", actor=actor, now=now,
            batch_id=batch_id)
    return names


def _reopen(conn, cur, workflow: dict, rows: list[dict], names: list[str], reason: str, *,
            actor: str, now: datetime | None, batch_id: uuid.UUID | None = None) -> None:
    if not names:
        raise Conflict(f"workflow {workflow['id']} has no dead, cancelled or skipped step to run again")
    clock = now or datetime.now(timezone.utc)
    steps, elements = split_elements(rows)
    by_name = {row["step"]: row for row in steps}
    # a reopened fan-out step's dead, cancelled and skipped elements run again, blocked until
    # the step is unblocked; its succeeded elements keep their outputs
    dead_elements = [e for name in names for e in elements.get(name, []) if e["status"] in REOPENABLE]
    cur.execute(q("job_lock"), {"ids": sorted([by_name[name]["id"] for name in names]
                                              + [e["id"] for e in dead_elements])})
    locked = {row["step"]: row for row in cur.fetchall()}
    handlers = dag.handlers_of(step_state(row).definition for row in steps)
    events: list[NewEvent] = []
    if workflow["status"] != RUNNING:
        deadline_at = (clock + timedelta(seconds=workflow["deadline_seconds"])
                       if workflow.get("deadline_seconds") is not None else None)
        events += workflow_resumed(workflow, names, reason, deadline_at)
    for name in names:
        row = locked[name]
        definition = step_state(row).definition
        status = dag.initial_status(definition, handlers)
        run_at = (wait_until(definition.type, definition.seconds, row["timeout_seconds"], clock)
                  if status == WAITING else clock)
        events += step_reopened(row, status, run_at, reason, batch_id=batch_id)
    for element in dead_elements:
        row = locked[element["step"]]
        events += step_reopened(row, BLOCKED, clock, reason, batch_id=batch_id)
    store.append(conn, events, actor=actor, now=now)
    advance(conn, [workflow["id"]], now=now, actor=actor)
