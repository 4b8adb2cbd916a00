"""Claim a batch of jobs from given queues in one statement (see job_claim in jobs.sql)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.rows import tuple_row
from qforge.sql import q


@dataclass(frozen=True)
class ClaimedJob:
    id: UUID
    task: str
    queue: str
    payload: dict[str, Any]
    attempt: int  # the fencing token every later report names
    timeout_seconds: float | None
    workflow_id: UUID | None
    step: str | None
    tags: dict[str, str]
    trace: dict[str, str] | None = None  # the enqueuer's trace context, for the run span


def claim(conn, queues: list[str], limit: int, worker: str, *,
          now: datetime | None = None) -> list[ClaimedJob]:
    """Lock, mark running and record Claimed for up to `limit` due jobs, highest priority first."""
    if limit <= 0 or not queues:
        return []
    # Pipelined: the transaction's start, the plan setting and the claim go in one
    # round trip, and its end in a second (an idle worker's enqueue-to-start latency
    # is mostly round trips).
    with conn.pipeline(), conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(q("job_claim_plan"))
        cur.execute(q("job_claim"), {"queues": list(queues), "limit": limit,
                                     "worker": worker, "now": now})
        return [ClaimedJob(*row) for row in cur.fetchall()]
