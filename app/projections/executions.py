"""Tag search: the jobs and workflows that carry all of several tags (GET /executions)."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row

from qforge.projections.jobs import jobs_by_ids
from qforge.projections.pages import decode_page_cursor, encode_page_cursor
from qforge.projections.workflows import WAIT_KINDS, workflows_by_ids
from qforge.sql import q


def search(conn, tags: list[tuple[str, str]], *, actor: str | None = None, limit: int = 50,
           cursor: str | None = None, waiting: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """Newest first across both kinds; each item is a job view or a workflow summary plus "kind".

    The intersection is computed in execution_tags (insert-only, primary key
    (key, value, kind, id)), so each tag is an index range, never a scan.
    With `actor`, only those the actor wrote an event for; `waiting` ("trigger" | "timer")
    keeps the running workflows that wait only on such steps. ValueError for a malformed cursor.
    """
    if not tags:
        return [], None
    after_created, after_id = decode_page_cursor(cursor)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("executions_by_tags"), {
            "keys": [key for key, _ in tags], "values": [value for _, value in tags],
            "actor": actor, "after_created": after_created, "after_id": after_id, "limit": limit + 1,
            "wait_type": WAIT_KINDS[waiting] if waiting else None,
        })
        hits = cur.fetchall()
    more = len(hits) > limit
    hits = hits[:limit]
    jobs = jobs_by_ids(conn, [h["id"] for h in hits if h["kind"] == "job"])
    workflows = workflows_by_ids(conn, [h["id"] for h in hits if h["kind"] == "workflow"])
    items = []
    for hit in hits:
        found = (jobs if hit["kind"] == "job" else workflows).get(hit["id"])
        if found is not None:
            items.append({"kind": hit["kind"], **found})
    next_cursor = encode_page_cursor(hits[-1]["created_at"], hits[-1]["id"]) if more else None
    return items, next_cursor
