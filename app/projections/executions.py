"""Tag search: the jobs and workflows that carry all of several tags (GET /executions)."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row

from qforge.projections.jobs import jobs_by_ids
from qforge.projections.pages import decode_page_cursor, encode_page_cursor, row_bytes
from qforge.projections.workflows import WAIT_KINDS, workflows_by_ids
from qforge.sql import q

LOAD_CHUNK = 20


def search(conn, tags: list[tuple[str, str]], *, actor: str | None = None, limit: int = 50,
           cursor: str | None = None, waiting: str | None = None,
           max_bytes: int | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """Newest first across both kinds; each item is a job view or a workflow summary plus "kind".

    Paged in the database (executions_by_tags walks the first tag's index range from the cursor
    and stops at the page's size); with `max_bytes` the page also ends once its items hold about
    that much JSON (at least one). With `actor`, only those the actor wrote an event for;
    `waiting` ("trigger" | "timer") keeps the running workflows that wait only on such steps.
    ValueError for a malformed cursor.
    """
    if not tags:
        return [], None
    _, after_id = decode_page_cursor(cursor)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("executions_by_tags"), {
            "keys": [key for key, _ in tags], "values": [value for _, value in tags],
            "actor": actor, "after_id": after_id, "limit": limit + 1,
            "wait_type": WAIT_KINDS[waiting] if waiting else None,
        })
        hits = cur.fetchall()
    more = len(hits) > limit
    hits = hits[:limit]
    items: list[dict[str, Any]] = []
    size, last = 0, None
    for start in range(0, len(hits), LOAD_CHUNK):  # a few views at a time: each may hold a MiB payload
        chunk = hits[start:start + LOAD_CHUNK]
        jobs = jobs_by_ids(conn, [h["id"] for h in chunk if h["kind"] == "job"])
        workflows = workflows_by_ids(conn, [h["id"] for h in chunk if h["kind"] == "workflow"])
        for hit in chunk:
            found = (jobs if hit["kind"] == "job" else workflows).get(hit["id"])
            if found is None:
                last = hit
                continue
            item = {"kind": hit["kind"], **found}
            weight = row_bytes(item)
            if max_bytes is not None and items and size + weight > max_bytes:
                return items, encode_page_cursor(last["created_at"], last["id"])
            items.append(item)
            size += weight
            last = hit
    next_cursor = encode_page_cursor(hits[-1]["created_at"], hits[-1]["id"]) if more else None
    return items, next_cursor
