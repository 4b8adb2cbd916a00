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
Starting a child and ending its parent's step advance workflows, so they are the
engine's (qforge.workflows.engine: start_child, finish_parent, finish_parents); here
are the rules they read.
"""

from __future__ import annotations

import uuid

from qforge.events import types as ev
from qforge.events.states import SUCCEEDED, WORKFLOW_FINISHED
from qforge.sql import q


def child_outcome(child: dict) -> ev.EventData | None:
    """How a parent's step ends once its child workflow ended (None while it runs)."""
    if child["status"] not in WORKFLOW_FINISHED:
        return None
    if child["status"] == SUCCEEDED:
        return ev.Succeeded(result=child["result"])
    return ev.Failed(attempt=0, reason="child_workflow",
                     error=f"child workflow {child['id']} {child['status']}"
                           + (f": {child['error']}" if child.get("error") else ""))


def children_to_cancel(cur, workflow_id: uuid.UUID) -> list[uuid.UUID]:
    """Running children of a workflow's steps (ids greater than the parent's: lock them after it)."""
    cur.execute(q("workflow_running_children"), {"id": workflow_id})
    return [row["id"] for row in cur.fetchall()]
