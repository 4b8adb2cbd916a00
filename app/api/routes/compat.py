"""The pod orchestrator's API: POST /workflow, GET /workflow/{workflowId}, GET /pods.

Its users switch without changes: each command runs as a `shell` step, its
statuses and field names are kept, and a worker slot stands for a pod.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response

from qforge.api.auth import Actor, needs
from qforge.api.common import ERRORS
from qforge.api.deps import Conn, ReadConn
from qforge.api.errors import ApiError
from qforge.api.models import CompatWorkflowIn, CompatWorkflowView, Pods
from qforge.workflows import engine as commands
from qforge.workflows.submit import find
from qforge.commands.errors import NotFound
from qforge.commands.specs import StepSpec, WorkflowSpec
from qforge.events import states
from qforge.projections import workflows as workflows_view
from qforge.projections.workers import pods as live_pods

router = APIRouter(tags=["pod orchestrator compatibility"])

# Our statuses in the pod orchestrator's words (a test checks that every status has one).
STEP_STATUS = {states.BLOCKED: "PENDING", states.WAITING: "PENDING", states.PENDING: "QUEUED",
               states.RUNNING: "RUNNING", states.SUCCEEDED: "COMPLETED", states.DEAD: "FAILED",
               states.CANCELLED: "FAILED", states.SKIPPED: "SKIPPED"}
WORKFLOW_STATUS = {states.RUNNING: "RUNNING", states.SUCCEEDED: "COMPLETED", states.FAILED: "FAILED",
                   states.CANCELLED: "FAILED"}
COMPAT_ERRORS = {400: ERRORS[400] | {"description": "invalid graph or body"},
                 **{k: v for k, v in ERRORS.items() if k not in (400, 422)}}


def to_spec(body: CompatWorkflowIn) -> WorkflowSpec:
    """Each command becomes a shell step that is not retried (a failure there skipped the
    dependents at once); workflowId becomes the external id and the idempotency key."""
    steps = [StepSpec(step=s.id, task="shell", payload={"command": s.command},
                      depends_on=s.dependsOn, max_retries=0) for s in body.steps]
    return WorkflowSpec(name=body.workflowId, tags={"workflowId": body.workflowId},
                        idempotency_key=f"pod-workflow:{body.workflowId}", steps=steps)


def compat_view(workflow: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    out = []
    for row in steps:
        result = row.get("result") if isinstance(row.get("result"), dict) else {}
        payload = row.get("payload") if isinstance(row.get("payload"), dict) else {}
        exit_code = result.get("exit_code")
        out.append({
            "id": row["step"], "command": payload.get("command"),
            "dependsOn": list(row.get("depends_on") or []),
            "status": STEP_STATUS.get(row["status"], "PENDING"),
            "stdout": result.get("stdout"),
            "exitCode": exit_code if isinstance(exit_code, int) else None,
            "startedAt": row.get("started_at"), "finishedAt": row.get("finished_at"),
            "lastHeartbeatAt": row.get("heartbeat_at"),
        })
    return {"workflowId": workflow.get("external_id") or str(workflow["id"]),
            "status": WORKFLOW_STATUS.get(workflow["status"], "RUNNING"), "steps": out}


def _find(conn, workflow_id: str) -> tuple[dict, list[dict]]:
    if "\x00" in workflow_id:
        raise ApiError(404, "not_found", "no workflow has a NUL character in its id")
    try:
        found_id = find(conn, external_id=workflow_id)
    except NotFound:
        try:  # a QForge workflow id works too
            found_id = uuid.UUID(workflow_id)
        except ValueError:
            raise ApiError(404, "not_found", f"workflow {workflow_id} not found") from None
    found = workflows_view.get_workflow_rows(conn, found_id)
    if found is None:
        raise ApiError(404, "not_found", f"workflow {workflow_id} not found")
    return found


@router.post("/workflow", status_code=201, response_model=CompatWorkflowView, **needs("operate"),
             responses={200: {"model": CompatWorkflowView,
                              "description": "this workflowId was submitted before"},
                        **COMPAT_ERRORS})
def submit(body: CompatWorkflowIn, conn: Conn, response: Response, actor: Actor) -> dict:
    """Run a DAG of shell commands; 400 on an invalid graph (duplicate ids, unknown
    dependencies, cycles), nothing stored."""
    workflow_id, created = commands.submit(conn, to_spec(body), actor=actor, external_id=body.workflowId)
    if not created:
        response.status_code = 200
    return compat_view(*_find(conn, str(workflow_id)))


@router.get("/workflow/{workflowId}", response_model=CompatWorkflowView, responses=COMPAT_ERRORS)
def status(workflow_id: Annotated[str, Path(alias="workflowId")], conn: ReadConn) -> dict:
    return compat_view(*_find(conn, workflow_id))


@router.get("/pods", response_model=Pods, responses=ERRORS)
def pods(conn: ReadConn, request: Request) -> dict:
    """Worker slots as pods: total live slots, free slots, names of busy slots."""
    return live_pods(conn, request.app.state.resources.settings.stale_seconds)
