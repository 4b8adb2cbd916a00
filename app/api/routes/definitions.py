"""/definitions: stored, versioned workflow definitions, and runs started from them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel

from qforge.api.auth import Actor, needs
from qforge.api.common import ERRORS, limit_query
from qforge.api.deps import Conn
from qforge.api.errors import ApiError
from qforge.api.models import WorkflowView
from qforge.workflows import definitions as commands
from qforge.workflows.engine import start_definition
from qforge.commands.specs import NAME_PATTERN
from qforge.projections import workflows as workflows_view

router = APIRouter(tags=["definitions"])

DefinitionName = Annotated[str, Path(pattern=NAME_PATTERN, description="letters, digits, _ . : -")]


class DefinitionView(BaseModel):
    name: str
    version: int
    latest_version: int
    document: dict[str, Any]
    created_at: datetime
    actor: str


class DefinitionSummary(BaseModel):
    name: str
    version: int
    created_at: datetime
    updated_at: datetime
    document: dict[str, Any]


class DefinitionList(BaseModel):
    items: list[DefinitionSummary]
    next: str | None = None


@router.put("/definitions/{name}", status_code=201, response_model=DefinitionView, responses=ERRORS)
def put_definition(name: DefinitionName, body: commands.DefinitionSpec, conn: Conn,
                   response: Response, actor: Actor) -> dict:
    """Store a new version of a definition (201 for its first version, 200 for a later one); an
    invalid graph is a 422 listing every problem, and nothing is stored."""
    stored = commands.store_definition(conn, name, body, actor=actor)
    if stored["version"] > 1:
        response.status_code = 200
    return stored


@router.get("/definitions", response_model=DefinitionList, responses=ERRORS)
def list_definitions(conn: Conn, limit: limit_query = 50,
                     cursor: Annotated[str | None, Query(max_length=200)] = None) -> dict:
    """Every definition's latest version, by name."""
    items, next_cursor = commands.list_definitions(conn, limit=limit, cursor=cursor)
    return {"items": items, "next": next_cursor}


@router.get("/definitions/{name}", response_model=DefinitionView, responses=ERRORS)
def get_definition(name: DefinitionName, conn: Conn,
                   version: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None) -> dict:
    """The latest version, or `?version=`."""
    found = commands.get_definition(conn, name, version)
    if found is None:
        raise ApiError(404, "not_found", f"definition {name}" + (f" version {version}" if version else "")
                       + " not found")
    return found


@router.post("/definitions/{name}/runs", status_code=201, response_model=WorkflowView, responses=ERRORS,
             **needs("operate"))
def run_definition(name: DefinitionName, conn: Conn, actor: Actor, body: commands.RunRequest | None = None) -> dict:
    """Start a workflow of the latest version, or of `version`; its root steps get `payload.inputs`
    and the workflow's `definition` names the version it runs."""
    request = body or commands.RunRequest()
    workflow_id = start_definition(conn, name, request.inputs, actor=actor, tags=request.tags,
                                            idempotency_key=request.idempotency_key, version=request.version)
    view = workflows_view.get_workflow(conn, workflow_id)
    assert view is not None
    return view
