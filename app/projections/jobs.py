"""The jobs read model as the API shows it: one job, and filtered, keyset-paginated lists."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from qforge.projections.pages import fetch_page
from qforge.sql import q

# The fields of GET /jobs/{id}, in order.
JOB_FIELDS = ("id", "task", "queue", "status", "priority", "attempts", "max_retries", "run_at",
              "payload", "result", "last_error", "tags", "workflow_id", "step", "worker",
              "heartbeat_at", "created_at", "updated_at",
              "concurrency_key", "concurrency_limit", "fairness_key")  # flow control (issue 16)


def job_view(row: dict[str, Any]) -> dict[str, Any]:
    """A jobs row (or an as-of fold of one) in the contract's shape, with the attempts that
    count against max_retries (not those handed back by a stopping worker, nor those spent
    before an operator's retry)."""
    view = {name: row.get(name) for name in JOB_FIELDS}
    if row.get("attempts") is not None and row.get("free_attempts") is not None:  # as-of folds lack it
        view["counted_attempts"] = row["attempts"] - row["free_attempts"]
    return view


def get_job_row(conn, job_id: UUID) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("job_get"), {"id": job_id})
        return cur.fetchone()


def get_job(conn, job_id: UUID) -> dict[str, Any] | None:
    row = get_job_row(conn, job_id)
    return None if row is None else job_view(row)


def list_jobs(conn, *, status: str | None = None, queue: str | None = None,
              task: str | None = None, tags: list[tuple[str, str]] | None = None,
              limit: int = 50, cursor: str | None = None,
              max_bytes: int | None = None) -> tuple[list[dict], str | None]:
    """Newest first; (items, next cursor or None); with `max_bytes`, the page ends once it holds
    about that much JSON. ValueError for a malformed cursor."""
    rows, next_cursor = fetch_page(conn, "jobs_list", {"status": status, "queue": queue, "task": task},
                                   tags=tags, limit=limit, cursor=cursor, max_bytes=max_bytes)
    return [job_view(row) for row in rows], next_cursor


def jobs_by_ids(conn, ids: list[UUID]) -> dict[UUID, dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("jobs_by_ids"), {"ids": ids})
        return {row["id"]: job_view(row) for row in cur.fetchall()}
