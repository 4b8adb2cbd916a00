"""The pod orchestrator's API (seeds/001): POST /workflow, GET /workflow/{workflowId}, GET /pods.

Its users switch without changes: each command runs as a `shell` step, its
statuses and field names are kept, and a worker slot stands for a pod.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response

from app.api.common import ERRORS
from app.api.deps import Conn
from app.api.errors import ApiError
from app.api.models import CompatWorkflowIn, CompatWorkflowView, Pods
from app.commands import workflows as commands
from app.commands.errors import Invalid, NotFound
from app.commands.workflows import StepSpec, WorkflowSpec
from app.projections import workflows as workflows_view
from app.projections.workers import pods as live_pods

router = APIRouter(tags=["pod orchestrator compatibility"])

STEP_STATUS = {"blocked": "PENDING", "waiting": "PENDING", "pending": "QUEUED",
               "running": "RUNNING", "succeeded": "COMPLETED", "dead": "FAILED",
               "cancelled": "FAILED", "skipped": "SKIPPED"}
WORKFLOW_STATUS = {"running": "RUNNING", "succeeded": "COMPLETED", "failed": "FAILED",
                   "cancelled": "FAILED"}
COMPAT_ERRORS = {400: ERRORS[400] | {"description": "invalid graph or body"},
                 **{k: v for k, v in ERRORS.items() if k not in (400, 422)}}


def to_spec(body: CompatWorkflowIn) -> WorkflowSpec:
    """Each command becomes a shell step that is not retried (a failure there skipped the
    dependents at once); workflowId becomes the external id and the idempotency key."""
    steps = [StepSpec(step=s.id, task="shell", payload={"command": s.command},
                      depends_on=s.dependsOn, max_retries=0) for s in body.steps]
    spec = WorkflowSpec(name=body.workflowId, tags={"workflowId": body.workflowId},
                        idempotency_key=f"pod-workflow:{body.workflowId}", steps=steps,
                        external_id=body.workflowId)
    problems = spec.problems()
    if problems:
        raise Invalid("invalid workflow: " + "; ".join(problems), problems)
    return spec


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
        found_id = commands.find(conn, external_id=workflow_id)
    except NotFound:
        try:  # a QForge workflow id works too
            found_id = uuid.UUID(workflow_id)
        except ValueError:
            raise ApiError(404, "not_found", f"workflow {workflow_id} not found") from None
    found = workflows_view.get_workflow_rows(conn, found_id)
    if found is None:
        raise ApiError(404, "not_found", f"workflow {workflow_id} not found")
    return found


@router.post("/workflow", status_code=201, response_model=CompatWorkflowView,
             responses={200: {"model": CompatWorkflowView,
                              "description": "this workflowId was submitted before"},
                        **COMPAT_ERRORS})
def submit(body: CompatWorkflowIn, conn: Conn, response: Response) -> dict:
    """Run a DAG of shell commands; 400 on an invalid graph (duplicate ids, unknown
    dependencies, cycles), nothing stored."""
    workflow_id, created = commands.submit(conn, to_spec(body), actor="api")
    if not created:
        response.status_code = 200
    return compat_view(*_find(conn, str(workflow_id)))


@router.get("/workflow/{workflowId}", response_model=CompatWorkflowView, responses=COMPAT_ERRORS)
def status(workflow_id: Annotated[str, Path(alias="workflowId")], conn: Conn) -> dict:
    return compat_view(*_find(conn, workflow_id))


@router.get("/pods", response_model=Pods, responses=ERRORS)
def pods(conn: Conn, request: Request) -> dict:
    """Worker slots as pods: total live slots, free slots, names of busy slots."""
    return live_pods(conn, request.app.state.resources.settings.stale_seconds)
