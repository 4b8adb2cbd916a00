"""A batch of workflows advanced at once (a worker's reports): next runs started together, new rows appended together.

Used by the engine's advance (qforge.workflows.engine) around a batch of workflows, and by
qforge.workflows.durable inside it. Neither changes what is written, only when: every
event is still appended in the advance's transaction, before it returns.
"""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from datetime import datetime
from typing import Any, Callable, Iterator

from qforge.events import store
from qforge.events.ids import new_id
from qforge.workflows import inline as inline_runs
from qforge.workflows import journal


# The events that advances of workflows alone in their tree leave to the end of the engine's
# advance (deferred_appends), by (actor, now): one append for a batch of reports, not one each.
_DEFERRED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("qforge_deferred_appends", default=None)


@contextlib.contextmanager
def deferred_appends(conn) -> Iterator[None]:
    """Around the engine's advance of a batch of workflows: the events of those alone in their tree
    (no parent, no sub-workflow: nothing else reads their rows meanwhile) are appended in one
    statement when it ends, still in its transaction; on an error they are dropped with it."""
    deferred: dict[tuple[str, datetime | None], list[dict]] = {}
    token = _DEFERRED.set(deferred)
    try:
        yield
    finally:
        _DEFERRED.reset(token)
    for (actor, now), rows in deferred.items():
        store.append_rows(conn, rows, actor=actor, now=now)


def emit(conn, rows: list[dict], *, actor: str, now: datetime | None, defer: bool) -> None:
    """Append event rows now, or (`defer`, inside deferred_appends) when the advance ends."""
    deferred = _DEFERRED.get() if defer else None
    if deferred is None:
        store.append_rows(conn, rows, actor=actor, now=now)
    else:
        deferred.setdefault((actor, now), []).extend(rows)


# The inline runs an advance of several workflows started together (early_runs), by workflow id:
# (the rows it ran on, its job, its future).
_EARLY: contextvars.ContextVar[dict | None] = contextvars.ContextVar("qforge_early_runs", default=None)


@contextlib.contextmanager
def early_runs(loaded: dict[uuid.UUID, tuple[dict[str, Any], list[dict[str, Any]]]],
               workflow_ids: list[uuid.UUID],
               wakes_inline: Callable[[dict[str, Any], list[dict[str, Any]]], bool]) -> Iterator[None]:
    """Around the engine's advance of a batch of workflows (their rows `loaded`): the next runs of
    the code workflows that will run theirs inline (`wakes_inline`: durable.wakes_inline, what
    advance_code does with those rows) start together, not one after the other's, each in its own thread as before;
    _wake takes the run started on the rows it has (the same list), else runs the function as
    before. A run started for nothing (the rows changed) is dropped, like one whose report
    rolled back."""
    runner = inline_runs.current()
    early: dict[uuid.UUID, tuple[list[dict[str, Any]], inline_runs.InlineRun, Any]] = {}
    for workflow_id in workflow_ids if runner is not None else ():
        workflow, rows = loaded.get(workflow_id, (None, None))
        if workflow is not None and wakes_inline(workflow, rows):
            runs = journal.activations(rows)
            run_job = inline_runs.InlineRun(new_id(), f"@{len(runs) + 1}", runs[-1]["queue"], workflow_id,
                                            journal.run_trace(rows))
            early[workflow_id] = (rows, run_job, inline_runs.submit(runner, workflow, rows, run_job))
    token = _EARLY.set(early)
    try:
        yield
    finally:
        _EARLY.reset(token)


def started_early(workflow: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[Any, Any] | None:
    """The run early_runs started for this workflow on these rows (taken once), or None."""
    early = _EARLY.get()
    started = early.pop(workflow["id"], None) if early else None
    return (started[1], started[2]) if started is not None and started[0] is rows else None
