"""/workflows: submit a DAG, read it, list, history, cancel, trigger a waiting step."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union
from uuid import UUID

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import Discriminator, Tag

from qforge.api.auth import Actor, Caller, needs
from qforge.api.common import (ERRORS, PROOF_DOC, as_of_view, bad_query, cursor_query, limit_query, missing,
                               proof_answer, proof_cursor, tag_query, tags_of)
from qforge.api.deps import Conn, ReadConn
from qforge.api.models import EventHistory, TriggerRequest, WorkflowCreated, WorkflowList, WorkflowView
from qforge.workflows import resume
from qforge.workflows import engine as commands
from qforge.commands.specs import WorkflowSpec
from qforge.events import store
from qforge.events.states import statuses
from qforge.projections import asof
from qforge.projections import workflows as workflows_view
from qforge.workflows import commands as code_commands
from qforge.workflows.durable import CodeWorkflowSpec

router = APIRouter(tags=["workflows"])


def _body_kind(body: Any) -> str:
    return "CodeWorkflowSpec" if isinstance(body, dict) and "code" in body else "WorkflowSpec"


# A graph (WorkflowSpec) or a workflow written as code (CodeWorkflowSpec), told apart by "code".
WorkflowBody = Annotated[Union[Annotated[WorkflowSpec, Tag("WorkflowSpec")],
                               Annotated[CodeWorkflowSpec, Tag("CodeWorkflowSpec")]],
                         Discriminator(_body_kind)]

WorkflowStatus = Literal[tuple(sorted(statuses("workflow")))]  # type: ignore[valid-type]


def _workflow(conn, workflow_id: UUID) -> dict:
    workflow = workflows_view.get_workflow(conn, workflow_id)
    if workflow is None:
        raise missing(conn, "workflow", workflow_id)
    return workflow


@router.post("/workflows", status_code=201, response_model=WorkflowCreated, **needs("operate"),
             responses={200: {"model": WorkflowCreated,
                              "description": "an existing workflow with the same idempotency_key"},
                        **ERRORS})
def create_workflow(body: WorkflowBody, conn: Conn, response: Response, actor: Actor) -> dict:
    """Submit a DAG, or start a workflow written as code (`{"code": name, "input"?}`). An invalid
    graph is a 422 whose details list every problem; nothing is stored."""
    if isinstance(body, CodeWorkflowSpec):
        workflow_id, created = code_commands.start(conn, body, actor=actor)
    else:
        workflow_id, created = commands.submit(conn, body, actor=actor)
    if not created:
        response.status_code = 200
    view = _workflow(conn, workflow_id)
    return {key: view[key] for key in ("id", "name", "status", "steps", "code")}


# Shaped like GET /jobs and GET /jobs/{id} (routes/jobs.py): one route per resource, which is how
# the contract reads; what they do alike (bad_query, tags_of, as_of_view) is shared already.
@router.get("/workflows", response_model=WorkflowList, responses=ERRORS)
def list_workflows(conn: ReadConn, status: Annotated[WorkflowStatus | None, Query()] = None,
                   tag: tag_query = None, limit: limit_query = 50,
                   cursor: cursor_query = None,
                   name: Annotated[str | None, Query(max_length=200)] = None) -> dict:
    """Workflows, newest first, with how many steps are in each status; filters: status, name, tags."""
    with bad_query():
        items, next_cursor = workflows_view.list_workflows(
            conn, status=status, tags=tags_of(tag), limit=limit, cursor=cursor, name=name)
    return {"items": items, "next": next_cursor}


@router.get("/workflows/{workflow_id}", response_model=WorkflowView, responses=ERRORS)
def get_workflow(workflow_id: UUID, conn: ReadConn, request: Request,
                 as_of: Annotated[int | None, Query(ge=0, le=2**62, description=(
                     "the workflow as it was right after this log position"))] = None) -> dict:
    if as_of is not None:
        return as_of_view(asof.workflow_as_of, request, workflow_id, as_of, f"workflow {workflow_id}")
    return _workflow(conn, workflow_id)


@router.get("/workflows/{workflow_id}/events", response_model=None,
            responses={200: {"model": EventHistory}, **ERRORS})
def workflow_events(workflow_id: UUID, conn: ReadConn) -> dict:
    """The workflow's own events and its steps' job events, in log order."""
    events = store.read_workflow(conn, workflow_id)
    if not events:
        raise missing(conn, "workflow", workflow_id)
    return {"events": [e.model_dump(mode="json") for e in events]}


@router.get("/workflows/{workflow_id}/proof", response_model=None, responses=ERRORS,
            description=f"The workflow's events with their hashes and Merkle paths, and the checkpoints up to the"
                        f" newest.{PROOF_DOC}")
def workflow_proof(workflow_id: UUID, conn: Conn, request: Request, who: Caller,
                   cursor: proof_cursor = None) -> dict:
    return proof_answer(conn, request, who, "workflow", workflow_id, cursor)


@router.post("/workflows/{workflow_id}/cancel", response_model=WorkflowView, responses=ERRORS,
             **needs("operate"))
def cancel_workflow(workflow_id: UUID, conn: Conn, actor: Actor) -> dict:
    """Cancel every unfinished step and the workflow (409 when it already finished)."""
    commands.cancel(conn, workflow_id, actor=actor)
    return _workflow(conn, workflow_id)


@router.post("/workflows/{workflow_id}/resume", response_model=WorkflowView, responses=ERRORS,
             **needs("operate"))
def resume_workflow(workflow_id: UUID, conn: Conn, actor: Actor) -> dict:
    """Run a failed or cancelled workflow again from where it stopped: its dead, cancelled and
    skipped steps run again with fresh retry budgets, succeeded steps keep their outputs (409
    when it is running or succeeded)."""
    resume.resume(conn, workflow_id, actor=actor)
    return _workflow(conn, workflow_id)


@router.post("/workflows/{workflow_id}/steps/{step}/trigger", response_model=WorkflowView,
             responses=ERRORS, **needs("operate"))
def trigger_step(workflow_id: UUID, step: Annotated[str, Path(max_length=200)], conn: Conn,
                 actor: Actor, body: TriggerRequest | None = None) -> dict:
    """Complete a waiting wait_for_trigger step; its payload becomes the step's output (409 if
    the step is not waiting)."""
    commands.trigger(conn, workflow_id, step, body.payload if body else None, actor=actor)
    return _workflow(conn, workflow_id)
