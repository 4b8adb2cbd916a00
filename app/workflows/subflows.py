"""Sub-workflows: a step of type "workflow" runs a child workflow from a stored definition.

When the DAG rules unblock such a step, it starts waiting (no worker holds it)
and its child is submitted in the same transaction, naming its parent
(`parent`: workflow id, step, step job id). When the child ends, the parent's
step ends with it: Succeeded with the child's result, or Failed +
DeadLettered (so `on_failure` applies) when the child failed or was
cancelled. The child's own transaction tries to do that at once, if it can
lock the parent without waiting (locks go parent before child, so a child
never waits for its parent); otherwise the monitor does it on its next tick
(`finish_parents`). Cancelling a parent cancels its running children.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from qforge.events import store
from qforge.events import types as ev
from qforge.events.states import SUCCEEDED, WAITING, WORKFLOW_FINISHED
from qforge.events.types import NewEvent
from qforge.settings import get_settings
from qforge.sql import q


def start_child(conn, row: dict, spec: dict[str, Any], inputs: dict[str, Any], workflow: dict,
                *, actor: str, now: datetime | None) -> tuple[uuid.UUID | None, str | None]:
    """Submit the child of a workflow step that was just unblocked; (child id, None) or (None, why not)."""
    from qforge.workflows.definitions import start_definition  # definitions -> workflows -> advance -> here
    from qforge.commands.errors import CommandError, Invalid
    child_inputs = {**inputs, **(spec.get("inputs") or {})}
    try:
        with conn.transaction():  # a child over the tree's budget is taken back whole
            child = start_definition(conn, spec["definition"], child_inputs, actor=actor, now=now,
                                     parent={"workflow_id": str(workflow["id"]), "step": row["step"],
                                             "job_id": str(row["id"]),
                                             "depth": (workflow.get("nesting") or 0) + 1},
                                     trace_parent=row.get("trace"))
            # Sub-workflows share their root's budget: 1,000 workflow steps each starting 1,000 more
            # would otherwise multiply a small request into a billion jobs.
            limit = get_settings().max_workflow_jobs
            with conn.cursor(row_factory=dict_row) as cur:
                cur.execute(q("workflow_tree_job_count"), {"id": child})
                jobs = cur.fetchone()["count"]
            if jobs > limit:
                raise Invalid(f"its jobs would make the workflow's tree {jobs} jobs, more than"
                              f" QFORGE_MAX_WORKFLOW_JOBS ({limit})")
    except CommandError as error:
        return None, f"could not start a workflow of definition '{spec['definition']}': {error}"
    return child, None


def child_outcome(child: dict) -> ev.EventData | None:
    """How a parent's step ends once its child workflow ended (None while it runs)."""
    if child["status"] not in WORKFLOW_FINISHED:
        return None
    if child["status"] == SUCCEEDED:
        return ev.Succeeded(result=child["result"])
    return ev.Failed(attempt=0, reason="child_workflow",
                     error=f"child workflow {child['id']} {child['status']}"
                           + (f": {child['error']}" if child.get("error") else ""))


def finish_parent(conn, child: dict, *, wait: bool, actor: str, now: datetime | None) -> bool:
    """End the parent step of a finished child; True when done (or nothing to do). With
    wait=False it gives up when the parent is locked (the caller holds the child's lock)."""
    from qforge.workflows.engine import advance
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("workflow_lock" if wait else "workflow_lock_unless_busy"),
                    {"ids": [child["parent_workflow_id"]]})
        if cur.fetchone() is None:
            return False
        cur.execute(q("job_lock"), {"ids": [child["parent_job_id"]]})
        step = cur.fetchone()
        outcome = child_outcome(child)
        if step is None or step["status"] != WAITING or outcome is None:
            return True
        base: dict[str, Any] = dict(stream_id=step["id"], tags=step["tags"], workflow_id=step["workflow_id"])
        events = [NewEvent(**base, version=step["version"] + 1, data=outcome)]
        if isinstance(outcome, ev.Failed):
            events.append(NewEvent(**base, version=step["version"] + 2,
                                   data=ev.DeadLettered(attempt=0, error=outcome.error)))
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


def children_to_cancel(cur, workflow_id: uuid.UUID) -> list[uuid.UUID]:
    """Running children of a workflow's steps (ids greater than the parent's: lock them after it)."""
    cur.execute(q("workflow_running_children"), {"id": workflow_id})
    return [row["id"] for row in cur.fetchall()]
