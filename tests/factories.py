"""Test factories: put jobs into any state through the real commands."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from qforge.commands.claim import claim
from qforge.commands.enqueue import JobSpec, enqueue
from qforge.commands.report import Report, fail


def make_job(conn, now: datetime | None = None, **fields: Any) -> UUID:
    fields.setdefault("task", "echo")
    return enqueue(conn, [JobSpec(**fields)], now=now)[0].id


def job_row(conn, job_id: UUID) -> dict:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM jobs WHERE id = %s", (job_id,))
        return cur.fetchone()


def event_types(conn, job_id: UUID) -> list[str]:
    with conn.cursor() as cur:
        cur.execute("SELECT type FROM events WHERE stream_id = %s ORDER BY version", (job_id,))
        return [row[0] if isinstance(row, tuple) else row["type"] for row in cur.fetchall()]


def claim_one(conn, worker: str = "w1", queue: str = "default", now: datetime | None = None):
    claimed = claim(conn, [queue], 1, worker, now=now)
    assert len(claimed) == 1, f"expected one claimable job in {queue}"
    return claimed[0]


def fail_once(conn, job, error: str = "boom", now: datetime | None = None):
    return fail(conn, [Report(job.id, job.attempt, error=error)], actor="w1", now=now)


def count(conn, query: str, *params) -> int:
    with conn.cursor() as cur:
        cur.execute(query, params)
        row = cur.fetchone()
        return row[0] if isinstance(row, tuple) else next(iter(row.values()))
