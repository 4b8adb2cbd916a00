"""Pieces several routers share: documented error responses, query parameters, as-of reads."""

from __future__ import annotations

import contextlib
from typing import Annotated, Any, Callable, Iterator
from uuid import UUID

from fastapi import Query, Request

from qforge.api.errors import ApiError
from qforge.api.models import ErrorBody
from qforge.projections.pages import parse_tags

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in [
        (400, "malformed input (JSON, cursor, tag)"), (401, "missing or wrong token"),
        (404, "unknown id"), (409, "the current state does not allow it"),
        (413, "body over QFORGE_MAX_BODY_BYTES"),
        (422, "invalid input; details name every problem"), (503, "database unavailable"),
    ]
}

limit_query = Annotated[int, Query(ge=1, le=500, description="page size (1-500)")]
tag_query = Annotated[list[str] | None, Query(
    max_length=20, description="key:value; repeat for more (all must match)")]


@contextlib.contextmanager
def bad_query() -> Iterator[None]:
    """A ValueError from parsing a cursor or a tag becomes a 400 naming it."""
    try:
        yield
    except ValueError as exc:
        raise ApiError(400, "bad_request", str(exc)) from None


def tags_of(pairs: list[str] | None) -> list[tuple[str, str]]:
    with bad_query():
        return parse_tags(pairs)


def as_of_view(read: Callable[[Any, UUID, int], dict | None], request: Request, stream_id: UUID,
               position: int, what: str) -> dict:
    """`read(conn, id, position)` (qforge.projections.asof), or 404 if it did not exist yet.

    On the primary even when reads go to a standby: the fold runs into temporary
    tables, which a hot standby cannot create."""
    with request.app.state.resources.pool.connection() as conn:
        view = read(conn, stream_id, position)
    if view is None:
        raise ApiError(404, "not_found", f"{what} did not exist at log position {position}")
    return view
