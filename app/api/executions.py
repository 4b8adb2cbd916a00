"""GET /executions: tag search over jobs and workflows."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from qforge.api.common import ERRORS, bad_query, limit_query, tags_of
from qforge.api.deps import Conn
from qforge.api.models import ExecutionList
from qforge.projections import executions

router = APIRouter(tags=["search"])


@router.get("/executions", response_model=ExecutionList, responses=ERRORS)
def search(conn: Conn,
           tag: Annotated[list[str], Query(min_length=1, max_length=20, description=(
               "key:value; repeat for more: an execution must carry all of them"))],
           limit: limit_query = 50,
           cursor: Annotated[str | None, Query(max_length=500)] = None,
           waiting: Annotated[Literal["trigger", "timer"] | None, Query(description=(
               "only running workflows that wait on nothing but a trigger (or a timer)"))] = None) -> dict:
    """Jobs and workflows carrying every given tag, newest first."""
    with bad_query():
        items, next_cursor = executions.search(conn, tags_of(tag), limit=limit, cursor=cursor,
                                               waiting=waiting)
    return {"items": items, "next": next_cursor}
