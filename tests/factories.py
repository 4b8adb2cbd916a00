"""Test factories: put jobs into any state through the real commands."""

from __future__ import annotations

import json
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


def append_raw(conn, stream_type: str, stream_id: UUID, version: int, event_type: str, data: dict,
               *, schema_version: int = 1, occurred_at: datetime | None = None, tags: dict | None = None,
               actor: str = "test") -> None:
    """Append one event by hand, as a writer that bypasses the commands would: chained to its
    stream's head like every append, but with no guard of its own (the fold's checks remain)."""
    table = {"job": "jobs", "workflow": "workflows", "token": "tokens"}[stream_type]
    conn.execute(
        "INSERT INTO events (stream_type, stream_id, version, type, schema_version, data, tags,"
        "                    occurred_at, actor, hash)"
        " SELECT %(st)s, %(id)s, %(v)s, %(type)s, %(sv)s, %(data)s, %(tags)s, a.at, %(actor)s,"
        "        event_hash(CASE WHEN %(v)s > 1 THEN (SELECT chain FROM " + table + " WHERE id = %(id)s) END,"
        "                   %(st)s, %(id)s, %(v)s, %(type)s, %(sv)s::smallint, %(data)s, %(tags)s, NULL,"
        "                   a.at, %(actor)s)"
        "   FROM (SELECT coalesce(%(at)s::timestamptz, now()) AS at) a",
        {"st": stream_type, "id": stream_id, "v": version, "type": event_type, "sv": schema_version,
         "data": json.dumps(data), "tags": json.dumps(tags) if tags else None, "at": occurred_at,
         "actor": actor})
