"""Commands on code workflows that the API and the SDK call: start (resume lives in qforge.workflows.resume)."""

from __future__ import annotations

import uuid
from datetime import datetime

from qforge.commands.errors import Invalid
from qforge.commands.plan import run
from qforge.workflows.durable import CodeWorkflowSpec, start_plan, traced_start
from qforge.workflows.registry import get_workflow, registered_workflow_names


def check_known(name: str) -> None:
    """Refuse a name this process could know but does not: one that has loaded workflow modules
    (`qforge dev --tasks`, an application starting its own). Elsewhere the API cannot know the
    workers' functions, and an unknown name fails the workflow with reason unknown_workflow."""
    known = registered_workflow_names()
    if known and get_workflow(name) is None:
        raise Invalid(f"code: no workflow {name!r} is registered (known: {', '.join(known)})",
                      [{"field": "code", "message": f"unknown workflow {name!r}"}])


def start(conn, spec: CodeWorkflowSpec, *, actor: str = "api",
          now: datetime | None = None) -> tuple[uuid.UUID, bool]:
    """Start a code workflow (its first activation is due at once); (id, created)."""
    check_known(spec.code)
    with traced_start(spec) as traced:
        workflow_id, created = run(conn, start_plan(spec, actor=actor, now=now, trace=traced.carrier))
        traced.set(workflow_id=workflow_id)
    return workflow_id, created
