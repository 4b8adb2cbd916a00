"""One door per transition: pure constructors of the job (step) and workflow events Python writes.

Each takes the row of a stream as its writer read it, under its lock (`id`, `version`,
`status`, `tags`; a job's `workflow_id`), and returns the stream's new events in order.
The stream versions are handed out here (version + 1, + 2, ...), and each transition is
checked against the state table (qforge.events.states) as it is built: an illegal one
raises IllegalTransition before anything is written (the fold in the database would
refuse it too, later and less clearly). `after(row, events)` is the row as those
events leave it, for a writer that appends to one stream twice in a transaction.
No I/O: the writers append what these return (qforge.events.store.append).

Where does a job become dead? In Python, only in `job_died` (Failed, then DeadLettered):
a trigger wait that timed out, a fan-out step whose list was bad or too big or whose
element died, a workflow step whose child workflow failed or could not start (graph and
code workflows). In SQL, only in the statement `job_fail` (app/sql/jobs.sql): a
worker's failed attempt with no retry left, and the monitor's stale jobs, which it fails
through the same report. The transition itself is the state table's rows
(running | waiting, DeadLettered) -> dead.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Mapping

from qforge.events import types as ev
from qforge.events.states import CANCELLED, FAILED, SUCCEEDED, next_status
from qforge.events.types import NewEvent

Row = Mapping[str, Any]


def _stream(machine: str, row: Row, datas: list[ev.EventData], workflow_id: uuid.UUID | None) -> list[NewEvent]:
    """`datas` as the next events of `row`'s stream, each transition checked from the status
    the previous one left."""
    status, events = row["status"], []
    for offset, data in enumerate(datas, 1):
        status = next_status(machine, status, data.type, getattr(data, "status", None))
        events.append(NewEvent(stream_id=row["id"], version=row["version"] + offset, data=data,
                               tags=row["tags"], workflow_id=workflow_id))
    return events


def _job(row: Row, *datas: ev.EventData) -> list[NewEvent]:
    return _stream("job", row, list(datas), row.get("workflow_id"))


def after(row: Row, events: list[NewEvent]) -> dict[str, Any]:
    """`row` as `events` (its own stream's, from a constructor here) leave it: its version and
    status moved on."""
    status = row["status"]
    for event in events:  # a workflow's own events name it as their workflow; its steps' name their job
        machine = "workflow" if event.stream_id == event.workflow_id else "job"
        status = next_status(machine, status, event.data.type, getattr(event.data, "status", None))
    return {**row, "version": events[-1].version if events else row["version"], "status": status}


def job_created(job_id: uuid.UUID, data: ev.Enqueued, tags: dict[str, str],
                workflow_id: uuid.UUID | None = None) -> list[NewEvent]:
    """A new job (a fan-out's element): its stream's first event."""
    return _stream("job", {"id": job_id, "version": 0, "status": None, "tags": tags}, [data], workflow_id)


def job_died(row: Row, reason: str, error: str, *, attempt: int | None = None) -> list[NewEvent]:
    """The job (step) fails for good: Failed, then DeadLettered (its workflow's on_failure applies).
    `attempt`: the attempt it names (default the row's, 0 for a step never claimed)."""
    attempt = (row.get("attempts") or 0) if attempt is None else attempt
    return _job(row, ev.Failed(attempt=attempt, reason=reason, error=error),
                ev.DeadLettered(attempt=attempt, error=error))


def job_succeeded(row: Row, result: Any) -> list[NewEvent]:
    """A step that no worker ran succeeds (a sleep's timer, a fan-out's list, a child's result)."""
    return _job(row, ev.Succeeded(result=result))


def job_cancelled(row: Row, reason: str, *, batch_id: uuid.UUID | None = None) -> list[NewEvent]:
    return _job(row, ev.Cancelled(reason=reason, batch_id=batch_id))


def job_retried_by_hand(row: Row, run_at: datetime, *, batch_id: uuid.UUID | None = None) -> list[NewEvent]:
    """An operator's retry of a dead or cancelled job: pending again, with a fresh retry budget."""
    return _job(row, ev.Retried(manual=True, delay_seconds=0, run_at=run_at, attempt=row["attempts"],
                                batch_id=batch_id))


def step_unblocked(row: Row, status: str, run_at: datetime | None, **data: Any) -> list[NewEvent]:
    """A blocked step's dependencies are done: pending (a task) or waiting (a wait, a fan-out, a
    child workflow) from `run_at`; `data`: the StepUnblocked's inputs, failed_step, error."""
    return _job(row, ev.StepUnblocked(status=status, run_at=run_at, **data))


def step_skipped(row: Row, reason: str, **data: Any) -> list[NewEvent]:
    """A step that will not run: a condition false, an upstream step that cannot succeed, a
    workflow's deadline; `data`: the Skipped's `when`."""
    return _job(row, ev.Skipped(reason=reason, **data))


def step_reopened(row: Row, status: str, run_at: datetime | None, reason: str, *,
                  batch_id: uuid.UUID | None = None) -> list[NewEvent]:
    """A resumed workflow's dead, cancelled or skipped step runs again: blocked, pending or waiting."""
    return _job(row, ev.StepReopened(status=status, run_at=run_at, reason=reason, batch_id=batch_id))


def step_triggered(row: Row, payload: dict[str, Any]) -> list[NewEvent]:
    """A waiting wait_for_trigger step was triggered: it succeeds with `payload`."""
    return _job(row, ev.Triggered(payload=payload))


def workflow_ended(workflow: Row, status: str, *, result: Any = None, error: str | None = None,
                   reason: str | None = None) -> list[NewEvent]:
    """The workflow ends `status` (succeeded with `result`, failed with `error` and `reason`, or
    cancelled)."""
    data: ev.EventData
    if status == SUCCEEDED:
        data = ev.WorkflowSucceeded(result=result)
    elif status == FAILED:
        data = ev.WorkflowFailed(error=error, reason=reason)
    elif status == CANCELLED:
        data = ev.WorkflowCancelled()
    else:
        raise ValueError(f"a workflow does not end {status!r}")
    return _stream("workflow", workflow, [data], workflow["id"])


def workflow_resumed(workflow: Row, steps: list[str], reason: str,
                     deadline_at: datetime | None) -> list[NewEvent]:
    """A failed or cancelled workflow runs again from `steps` (each then gets a step_reopened)."""
    return _stream("workflow", workflow, [ev.WorkflowResumed(steps=steps, reason=reason, deadline_at=deadline_at)],
                   workflow["id"])
