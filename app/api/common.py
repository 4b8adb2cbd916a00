"""Pieces several routers share: documented error responses, query parameters, as-of reads."""

from __future__ import annotations

import contextlib
import pathlib
from typing import Annotated, Any, Callable, Iterator
from uuid import UUID

from fastapi import Query, Request

from qforge.api import redact
from qforge.api.errors import ApiError
from qforge.api.models import ErrorBody
from qforge.audit import proofs as audit_proof
from qforge.log import archived
from qforge.projections.pages import parse_tags

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in [
        (400, "malformed input (JSON, cursor, tag)"), (401, "missing or wrong token"),
        (403, "the token's scope is below the route's (details[0].needed_scope names it)"),
        (404, "unknown id"), (409, "the current state does not allow it"),
        (410, "archived: the execution's events are in an archive segment (named in details)"),
        (413, "body over QFORGE_MAX_BODY_BYTES"),
        (415, "a write whose body is not application/json"),
        (422, "invalid input; details name every problem"),
        (429, "too many open streams for this token (QFORGE_API_STREAMS_PER_TOKEN)"),
        (503, "database unavailable"),
    ]
}

limit_query = Annotated[int, Query(ge=1, le=500, description="page size (1-500)")]
tag_query = Annotated[list[str] | None, Query(
    max_length=20, description="key:value; repeat for more (all must match)")]
cursor_query = Annotated[str | None, Query(max_length=500)]  # the `next` of the previous page


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


PROOF_DOC = """
    Check it alone with tools/verify_audit_proof.py against a head you kept (`qforge audit head`).
    In pages of about QFORGE_API_PAGE_BYTES (events first, then checkpoints): follow `next` and
    join every page's events and checkpoints; `status` is the server's check when one page holds
    it all. A read token's proof masks secret-looking fields (those events say "redacted")."""
proof_cursor = Annotated[str | None, Query(max_length=500, description="the `next` of the previous page")]


def proof_answer(conn, request: Request, who: Any, kind: str, stream_id: UUID, cursor: str | None) -> dict:
    """A page of the proof of a job or a workflow, as `who` may see it (redacted for a read token:
    qforge.api.redact.redact_proof); 404/410 when there is none."""
    with bad_query():
        found = audit_proof.proof_page(conn, kind, stream_id, cursor=cursor, archive=archive_dir(request),
                                       max_bytes=request.app.state.resources.settings.api_page_bytes)
    if found is None:
        raise missing(conn, kind, stream_id)
    if who.scope != "read":
        return found
    return redact.redact_proof(found, redact.ALWAYS | request.app.state.resources.settings.redact_names)


def archive_dir(request: Request) -> pathlib.Path | None:
    """This API's QFORGE_ARCHIVE_DIR, if set (a proof completes archived streams from it)."""
    directory = request.app.state.resources.settings.archive_dir
    return pathlib.Path(directory) if directory else None
