"""Code workflows on the job machinery: start one, and advance it when a step or an activation ends.

A code workflow is a workflow row (WorkflowSubmitted with `code` and `input`)
whose jobs are its steps and its activations (qforge.workflows.journal). It
resumes by re-running: when what the last activation waited on has finished, a
new activation job is enqueued; a worker claims it like any job, replays the
function (qforge.workflows.activation) and its Succeeded result is turned here,
in the completion's transaction and under the workflow's lock, into the new
steps (jobs), a timer, a trigger wait, or the workflow's end. Waiting holds no
worker slot: between activations the function exists only in the log.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from concurrent.futures import Future
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterator

from psycopg.rows import dict_row
from pydantic import ConfigDict, Field, field_validator

from qforge.commands.enqueue import enqueued_event, job_row
from qforge.commands.errors import CommandError
from qforge.commands.plan import Plan, Statement
from qforge.commands.plan import run as plan_run
from qforge.commands.specs import NAME_PATTERN, Storable, check_tags
from qforge.events import store
from qforge.events import types as ev
from qforge.events.ids import new_id
from qforge.events.states import (CANCELLED, DEAD, FAILED, JOB_ACTIVE, JOB_FINISHED, PENDING, RUNNING, SKIPPED,
                                  SUCCEEDED, WAITING, WORKFLOW_FINISHED)
from qforge.events.types import NewEvent
from qforge.events.transitions import (after, job_cancelled, job_created, job_died, job_succeeded, step_reopened,
                                       step_skipped, workflow_ended, workflow_resumed)
from qforge import tracing
from qforge.sql import q
from qforge.workflows import batch
from qforge.workflows import inline as inline_runs
from qforge.workflows import journal
from qforge.workflows.definitions import get_definition
from qforge.workflows.replay import STEP_OPS
from qforge.workflows.rows import over_job_cap
from qforge.workflows.submitted import store_submitted

NEVER = datetime(9999, 12, 31, tzinfo=timezone.utc)  # a trigger wait without timeout
# An activation that crashes (its worker killed) runs again: a crash is not the function's fault,
# so it gets many tries; the function's own errors end the workflow at once (activation.failed).
ACTIVATION_RETRIES = 20
RUNNING_FIRST = timedelta(milliseconds=1)  # see advance_code


class CodeWorkflowSpec(Storable):
    """POST /workflows with `code`: `{"code", "input"?, "tags"?, "idempotency_key"?,
    "deadline_seconds"?, "queue"?}` (queue: where its activations run; default "default")."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(min_length=1, max_length=200, pattern=NAME_PATTERN,
                      description="the @qforge.workflow name of the function")
    input: Any = None
    tags: dict[str, str] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    deadline_seconds: float | None = Field(default=None, gt=0, le=365 * 86400)
    queue: str = Field(default="default", pattern=NAME_PATTERN)

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: dict[str, str]) -> dict[str, str]:
        return check_tags(tags)


def activation_row(workflow_id: uuid.UUID, number: int, queue: str, tags: dict[str, str],
                   due: datetime | None = None, trace: dict[str, str] | None = None,
                   job_id: uuid.UUID | None = None) -> dict[str, Any]:
    data = ev.Enqueued(task=journal.TASK, queue=queue, max_retries=ACTIVATION_RETRIES, payload={"n": number},
                       step=f"@{number}", step_type=journal.ACTIVATION, run_at=due, trace=trace)
    return job_row(job_id or new_id(), data, tags, workflow_id)


def start_plan(spec: CodeWorkflowSpec, *, actor: str, now: datetime | None = None,
               parent: dict[str, Any] | None = None,
               trace: dict[str, str] | None = None) -> Plan[tuple[uuid.UUID, bool]]:
    """The workflow and its first activation, as statements (the caller's transaction, or the API's).
    `trace`: the qforge.submit span's context (traced_start), carried by every job of the run."""
    clock = now or datetime.now(timezone.utc)
    workflow_id = new_id()
    submitted = ev.WorkflowSubmitted(
        name=spec.code, code=spec.code, input=spec.input, steps=[], idempotency_key=spec.idempotency_key,
        deadline_seconds=spec.deadline_seconds, parent=parent,
        deadline_at=clock + timedelta(seconds=spec.deadline_seconds) if spec.deadline_seconds else None)
    existing = yield from store_submitted(workflow_id, submitted, spec.tags, actor=actor, now=now)
    if existing is not None:
        return existing, False
    yield [Statement(q("job_enqueue"), {"jobs": json.dumps([activation_row(workflow_id, 1, spec.queue, spec.tags, trace=trace)]),
                                        "actor": actor, "now": now})]
    return workflow_id, True


@contextlib.contextmanager
def traced_start(spec: CodeWorkflowSpec, parent: dict[str, str] | None = None) -> Iterator[tracing.Traced]:
    """The run's trace: a qforge.submit span (a child of the current span, or of the stored context
    `parent`: a parent workflow's) whose context start_plan stores in the run's jobs, so each
    step's and each activation's qforge.run is its child, as for graph workflows."""
    with tracing.span("qforge.submit", parent=parent, workflow=spec.code) as traced:
        yield traced


def read_history(conn, workflow_id: uuid.UUID) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The workflow's row and all its job rows: what an activation replays."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("workflow_get"), {"id": workflow_id})
        workflow = cur.fetchone()
        cur.execute(q("workflow_steps"), {"id": workflow_id})
        return workflow, cur.fetchall()


def step_event(op: dict[str, Any], clock: datetime, due: datetime | None = None,
               trace: dict[str, str] | None = None) -> ev.Enqueued:
    """The job a new operation of the function becomes (a task step due at `due`, see advance_code)."""
    after = list(op.get("after") or [])
    if op["op"] == "sleep":
        return ev.Enqueued(task="sleep", step=op["step"], step_type="sleep", status=WAITING,
                           run_at=clock + timedelta(seconds=op["seconds"]), seconds=op["seconds"], depends_on=after)
    if op["op"] == "child":  # waits for its sub-workflow (qforge.workflows.engine.finish_parent ends it)
        return ev.Enqueued(task="workflow", step=op["step"], step_type="workflow", status=WAITING, run_at=NEVER,
                           payload={"workflow": op["workflow"], "input": op.get("input")}, depends_on=after)
    if op["op"] == "wait":
        timeout = op.get("timeout")
        return ev.Enqueued(task="wait_for_trigger", step=op["step"], step_type="wait_for_trigger", status=WAITING,
                           run_at=NEVER if timeout is None else clock + timedelta(seconds=timeout),
                           timeout_seconds=timeout, depends_on=after)
    options = dict(op.get("options") or {})
    delay = options.pop("delay_seconds", None)
    return ev.Enqueued(task=op["task"], payload=op.get("payload") or {}, step=op["step"], step_type="task",
                       status=PENDING, run_at=clock + timedelta(seconds=delay) if delay else due,
                       depends_on=after, trace=trace, **options)


def advance_code(conn, cur, workflow: dict[str, Any], rows: list[dict[str, Any]], clock: datetime, *,
                 now: datetime | None, actor: str, start_definition: Callable[..., uuid.UUID],
                 inline: bool = True, pending: list[NewEvent] | None = None) -> bool:
    """Act on what the newest activation decided (the caller holds the workflow's lock); True when
    the workflow ended. `start_definition`: the engine's (a child may run a stored definition; the
    engine calls this module, so it hands its own starter in). `inline`: the next run may run here
    (see qforge.workflows.inline). `pending`: that run's events, appended with the next write."""
    pending = pending or []
    runs = journal.activations(rows)
    last = runs[-1]
    if last["status"] in JOB_ACTIVE:
        return False  # the function is running, or about to: it will see what happened
    if last["status"] != SUCCEEDED:  # it crashed more often than it may, or was cancelled
        _end(conn, workflow, rows, {"status": "failed", "reason": "error", "error": (
            f"error: the workflow function's run {last['step']} {last['status']}: {last.get('last_error')}")},
            now=now, actor=actor)
        return True
    decided = journal.decisions(last)
    if decided.get("outcome"):  # steps it started and never waited for do not run
        _end(conn, workflow, rows, decided["outcome"], now=now, actor=actor, pending=pending)
        return True
    steps, new = _steps_and_new(rows, decided)
    # A running workflow's next step and run are due since just before the workflow started: among
    # equal priorities, work of older workflows is claimed before a backlog of newer ones (the
    # claim's order is run_at), and before the first runs of workflows started at the same time
    # (one transaction may start a thousand: their first runs are due at the same instant, and the
    # ids of the next steps would sort after all of them), so each workflow's step-to-step latency
    # is not the whole backlog's.
    due, trace = workflow["created_at"] - RUNNING_FIRST, journal.run_trace(rows)
    rows_in = [job_row(new_id(), step_event(op, clock, due, trace), workflow["tags"], workflow["id"]) for op in new]
    known = _alone(workflow, rows)
    if rows_in and known is None:
        pending = _append(conn, pending, [], actor=actor, now=now)  # the tree's count sees the run
    # A loop in the function cannot write more jobs than a fan-out could.
    if rows_in and (over := over_job_cap(cur, workflow["id"], len(rows_in), known=known)):
        problem = (f"too_many_jobs: {len(rows_in)} more steps would make the workflow's tree {over[0]} jobs,"
                   f" more than QFORGE_MAX_WORKFLOW_JOBS ({over[1]})")
        _end(conn, workflow, rows, {"status": "failed", "reason": "too_many_jobs", "error": problem},
             now=now, actor=actor, pending=pending)
        return True
    # Alone in its tree, with no sub-workflow to start, nothing reads its new rows before the
    # advance ends: they go in with the other workflows' (batch.deferred_appends).
    defer = known is not None and not any(op["op"] == "child" for op in new)
    pending = _append(conn, pending, rows_in, actor=actor, now=now, defer=defer)
    finished = {name for name, row in steps.items() if row["status"] in JOB_FINISHED}
    finished |= {op["step"] for op, row in zip(new, rows_in)  # a child that could not start
                 if op["op"] == "child" and _start_child(conn, workflow, op, row["id"], last["queue"],
                                                         actor=actor, now=now, trace=trace,
                                                         start_definition=start_definition)}
    # What it waited on may have finished while it ran (their advance found it running): wake it now.
    if all(name in finished for name in decided.get("waiting_on", [])):
        return _wake(conn, cur, workflow, rows, clock, inline=inline and not rows_in, now=now, actor=actor,
                     start_definition=start_definition)
    return False


def _steps_and_new(rows: list[dict[str, Any]], decided: dict[str, Any]) -> tuple[dict[str, dict], list[dict]]:
    """The workflow's steps by name, and the step operations the newest run decided that have no
    row yet (to start now)."""
    steps = {row["step"]: row for row in rows if not journal.is_activation(row)}
    return steps, [op for op in decided.get("ops", []) if op.get("op") in STEP_OPS and op["step"] not in steps]


def wakes_inline(workflow: dict[str, Any], rows: list[dict[str, Any]]) -> bool:
    """advance_code, given these rows, goes straight to _wake, which runs the function's next run
    inline where it may: a running code workflow whose last run succeeded, decided no outcome and
    nothing new to start, and all it waits on has finished (batch.early_runs starts such runs
    ahead, several at once)."""
    if not workflow.get("code") or workflow["status"] in WORKFLOW_FINISHED:
        return False
    runs = journal.activations(rows)
    if not runs or runs[-1]["status"] != SUCCEEDED:
        return False
    decided = journal.decisions(runs[-1])
    steps, new = _steps_and_new(rows, decided)
    return not decided.get("outcome") and not new and all(
        name in steps and steps[name]["status"] in JOB_FINISHED for name in decided.get("waiting_on", []))


def _wake(conn, cur, workflow: dict[str, Any], rows: list[dict[str, Any]], clock: datetime, *, inline: bool,
          now: datetime | None, actor: str, start_definition: Callable[..., uuid.UUID]) -> bool:
    """The function's next run: here (inline) if it can, else as a job (advance_code)."""
    runs, trace = journal.activations(rows), journal.run_trace(rows)
    number, queue = len(runs) + 1, runs[-1]["queue"]
    runner = inline_runs.current() if inline else None
    early = batch.started_early(workflow, rows) if runner is not None else None
    if early is not None:  # started with the batch's others (early_runs), on these very rows
        run_job, ran = early[0], inline_runs.wait(early[1])
    else:
        run_job = inline_runs.InlineRun(new_id(), f"@{number}", queue, workflow["id"], trace)  # its job, either way
        ran = runner is not None and inline_runs.run(runner, workflow, rows, run_job)
    if isinstance(ran, dict):  # what it decided is acted on at once, as for a run that was a job
        run, events = record_inline(workflow, ran, number, queue, trace, run_job.id)
        return advance_code(conn, cur, workflow, [*rows, run], clock, now=now, actor=actor,
                            start_definition=start_definition, inline=False, pending=events)
    row = activation_row(workflow["id"], number, queue, workflow["tags"], workflow["created_at"] - RUNNING_FIRST,
                         trace, job_id=run_job.id)
    if isinstance(ran, Future):  # still running: the job's run takes it over (adopt)
        inline_runs.pending_put(row["id"], ran)
    cur.execute(q("job_enqueue"), {"jobs": json.dumps([row]), "actor": actor, "now": now})
    return False


def _append(conn, pending: list[NewEvent], jobs: list[dict[str, Any]], *, actor: str,
            now: datetime | None, defer: bool = False) -> list[NewEvent]:
    """An inline run's events and the Enqueued events of new jobs (job_enqueue's rows: the same
    events as job_enqueue writes), in one statement; nothing left pending (an empty list).
    `defer`: with the other workflows' at the end of the advance, if it defers (batch.deferred_appends)."""
    if pending or jobs:
        batch.emit(conn, [*(event.row() for event in pending), *map(enqueued_event, jobs)], actor=actor, now=now,
                   defer=defer)
    return []


def _alone(workflow: dict[str, Any], rows: list[dict[str, Any]]) -> int | None:
    """The jobs of the workflow's tree when `rows` are all of them (no parent, no sub-workflow: a
    code workflow has no fan-out elements), else None (over_job_cap counts the tree)."""
    if workflow.get("parent_workflow_id") or any(row["step_type"] == "workflow" for row in rows):
        return None
    return len(rows)


def record_inline(workflow: dict[str, Any], decided: dict[str, Any], number: int, queue: str,
                  trace: dict[str, str] | None, job_id: uuid.UUID) -> tuple[dict[str, Any], list[NewEvent]]:
    """An inline run as a succeeded activation: the run's row as the history reads it, and its
    events to append (Enqueued waiting, then Succeeded with its decisions)."""
    enqueued = ev.Enqueued(task=journal.TASK, queue=queue, max_retries=ACTIVATION_RETRIES, payload={"n": number},
                           step=f"@{number}", step_type=journal.ACTIVATION, status=WAITING, run_at=NEVER,
                           trace=trace)
    new_row = {"id": job_id, "version": 0, "status": None, "tags": workflow["tags"], "workflow_id": workflow["id"]}
    created = job_created(job_id, enqueued, workflow["tags"], workflow["id"])
    succeeded = job_succeeded(after(new_row, created), decided)
    return {"id": job_id, "step": enqueued.step, "step_type": journal.ACTIVATION, "task": journal.TASK,
            "status": SUCCEEDED, "result": decided, "payload": enqueued.payload, "queue": queue,
            "tags": workflow["tags"], "trace": trace, "version": 2, "attempts": 0, "last_error": None}, \
        [*created, *succeeded]


MAX_NESTING = 10  # as for graph workflows' sub-workflows


def _start_child(conn, workflow: dict[str, Any], op: dict[str, Any], job_id: str, queue: str, *, actor: str,
                 now: datetime | None, trace: dict[str, str] | None = None,
                 start_definition: Callable[..., uuid.UUID]) -> bool:
    """Start ctx.child's sub-workflow: the stored definition of that name if there is one, else the
    code workflow (the API, the monitor and workers all advance, and only workers know functions).
    One that cannot start ends its step at once (the function gets StepFailed): then True."""
    depth = (workflow.get("nesting") or 0) + 1
    parent = {"workflow_id": str(workflow["id"]), "step": op["step"], "job_id": job_id, "depth": depth}
    problem = None
    try:
        if depth > MAX_NESTING:
            problem = f"sub-workflows nest more than {MAX_NESTING} deep (a workflow that starts itself?)"
        elif get_definition(conn, op["workflow"]) is not None:
            inputs = op.get("input")
            start_definition(conn, op["workflow"], inputs if inputs is not None else {}, actor=actor, now=now,
                             parent=parent, trace_parent=trace)
        else:
            spec = CodeWorkflowSpec(code=op["workflow"], input=op.get("input"), tags=workflow["tags"],
                                    queue=queue)
            with traced_start(spec, parent=trace) as traced:
                plan_run(conn, start_plan(spec, actor=actor, now=now, parent=parent, trace=traced.carrier))
    except (CommandError, ValueError) as error:
        problem = f"could not start sub-workflow {op['workflow']!r}: {error}"
    if problem is None:
        return False
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("job_lock"), {"ids": [job_id]})
        row = cur.fetchone()
    store.append(conn, job_died(row, "child_workflow", problem, attempt=0), actor=actor, now=now)
    return True


def _end(conn, workflow: dict[str, Any], rows: list[dict[str, Any]], outcome: dict[str, Any], *,
         now: datetime | None, actor: str, pending: list[NewEvent] | None = None) -> None:
    """The function returned (or failed): steps it started and never waited for are cancelled
    (`pending`: the events of the inline run that returned, appended first)."""
    workflow_id, rows_all = workflow["id"], rows
    active = sorted(r["id"] for r in rows if r["status"] in JOB_ACTIVE)
    rows = []
    if active:
        with conn.cursor(row_factory=dict_row) as locking:  # a heartbeat may have moved them on: re-read locked
            locking.execute(q("job_lock"), {"ids": active})
            rows = locking.fetchall()
    reason = "the workflow function returned"
    events = [event for r in rows if r["status"] in JOB_ACTIVE
              for event in (job_cancelled(r, reason) if r["status"] == RUNNING else step_skipped(r, reason))]
    events += workflow_ended(workflow, SUCCEEDED if outcome["status"] == SUCCEEDED else FAILED,
                             result=outcome.get("result"), error=outcome.get("error"), reason=outcome.get("reason"))
    # alone in its tree, no parent waits to hear of its end (engine._tell_parent): deferred as its steps
    batch.emit(conn, [event.row() for event in [*(pending or []), *events]], actor=actor, now=now,
               defer=_alone(workflow, rows_all) is not None)
    tracing.ended(journal.run_trace(rows_all), "qforge.workflow.end", workflow_id=workflow_id, status=outcome["status"],
                  error=outcome.get("error"))


REOPENABLE = frozenset({DEAD, CANCELLED, SKIPPED})


def resume_code(conn, cur, workflow: dict[str, Any], rows: list[dict[str, Any]], *, actor: str,
                now: datetime | None) -> list[str]:
    """Resume a failed or cancelled code workflow (workflow locked): its steps that did not succeed
    run again, those that did keep their results, and a new run of the function replays from the
    top (with the code deployed now: resuming after a fix goes on with the fix)."""
    clock = now or datetime.now(timezone.utc)
    reopened = sorted((r for r in rows if not journal.is_activation(r) and r["status"] in REOPENABLE),
                      key=lambda r: r["id"])
    cur.execute(q("job_lock"), {"ids": [r["id"] for r in reopened]})
    names = [r["step"] for r in cur.fetchall()]
    deadline_at = (clock + timedelta(seconds=workflow["deadline_seconds"])
                   if workflow.get("deadline_seconds") is not None else None)
    events = workflow_resumed(workflow, names, "resume", deadline_at)
    for row in reopened:
        waits = row["step_type"] in ("sleep", "wait_for_trigger")
        run_at = (clock + timedelta(seconds=row["sleep_seconds"] if row["step_type"] == "sleep"
                                    else row["timeout_seconds"] or 0) if waits else clock)
        if row["step_type"] == "wait_for_trigger" and row["timeout_seconds"] is None:
            run_at = NEVER
        events += step_reopened(row, WAITING if waits else PENDING, run_at, "resume")
    store.append(conn, events, actor=actor, now=now)
    runs = journal.activations(rows)
    queue = runs[-1]["queue"] if runs else "default"
    cur.execute(q("job_enqueue"), {"jobs": json.dumps([activation_row(workflow["id"], len(runs) + 1, queue,
                                                                      workflow["tags"], trace=journal.run_trace(rows))]),
                                   "actor": actor, "now": now})
    return names
