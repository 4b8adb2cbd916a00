"""Pieces several routers share: documented error responses, query parameters, as-of reads."""

from __future__ import annotations

import contextlib
import pathlib
from typing import Annotated, Any, Callable, Iterator
from uuid import UUID

from fastapi import Query, Request

from qforge.api.errors import ApiError
from qforge.api.models import ErrorBody
from qforge.projections import archived
from qforge.projections.pages import parse_tags

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in [
        (400, "malformed input (JSON, cursor, tag)"), (401, "missing or wrong token"),
        (403, "the token's scope is below the route's (details[0].needed_scope names it)"),
        (404, "unknown id"), (409, "the current state does not allow it"),
        (410, "archived: the execution's events are in an archive segment (named in details)"),
        (413, "body over QFORGE_MAX_BODY_BYTES"),
        (415, "a body that is not sent as Content-Type: application/json"),
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


def missing(conn, kind: str, stream_id) -> ApiError:
    """The error for an id the read model does not have: 410 naming the archive segment
    that holds it, when one may; 404 otherwise."""
    held = archived.segments_holding(conn, stream_id)
    if not held:
        return ApiError(404, "not_found", f"{kind} {stream_id} not found")
    names = ", ".join(s["segment"] for s in held)
    return ApiError(410, "archived", f"{kind} {stream_id} is archived: its events are in archive segment"
                    f" {names} (qforge history {stream_id} --archive DIR prints them)",
                    [{"segment": s["segment"], "first_position": s["first_position"],
                      "last_position": s["last_position"]} for s in held])


def archive_dir(request: Request) -> pathlib.Path | None:
    """This API's QFORGE_ARCHIVE_DIR, if set (a proof completes archived streams from it)."""
    directory = request.app.state.resources.settings.archive_dir
    return pathlib.Path(directory) if directory else None
