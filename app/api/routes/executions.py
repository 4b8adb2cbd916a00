"""GET /executions: tag search over jobs and workflows."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from qforge.api.common import ERRORS, bad_query, cursor_query, limit_query, tags_of
from qforge.api.deps import PageBytes, ReadConn
from qforge.api.models import ExecutionList
from qforge.projections import executions

router = APIRouter(tags=["search"])


@router.get("/executions", response_model=ExecutionList, responses=ERRORS)
def search(conn: ReadConn, max_bytes: PageBytes,
           tag: Annotated[list[str], Query(min_length=1, max_length=20, description=(
               "key:value; repeat for more: an execution must carry all of them"))],
           actor: Annotated[str | None, Query(max_length=200, description=(
               "only executions this actor (a token's name, a worker...) wrote an event for"))] = None,
           limit: limit_query = 50,
           cursor: cursor_query = None,
           waiting: Annotated[Literal["trigger", "timer"] | None, Query(description=(
               "only running workflows that wait on nothing but a trigger (or a timer)"))] = None) -> dict:
    """Jobs and workflows carrying every given tag (and touched by `actor`), newest first."""
    with bad_query():
        items, next_cursor = executions.search(conn, tags_of(tag), actor=actor, limit=limit, cursor=cursor,
                                               waiting=waiting, max_bytes=max_bytes)
    return {"items": items, "next": next_cursor}
