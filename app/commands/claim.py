"""Claim a batch of jobs from given queues in one statement (see job_claim in jobs.sql)."""

from __future__ import annotations

import contextlib
import time
import weakref
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from psycopg.rows import tuple_row

from qforge.commands import tx
from qforge.sql import q


class ClaimedJob(NamedTuple):
    """A claimed job: a claim's row, by name. A named tuple rather than a frozen dataclass, as the
    worker makes one per job: from the row at once (_make), ~0.5 µs instead of ~1.6."""

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
    """Lock, mark running and record Claimed for up to `limit` due jobs, highest priority first.

    One claim statement: job_claim_plain, or, when it finds jobs with a concurrency or fairness
    key in reach (it then claims nothing and says so with one row of nulls), job_claim. After
    such an answer this connection goes straight to job_claim for FLOW_MEMORY_SECONDS (either
    statement is right for any jobs: this only spares the plain one's round trip while keyed
    or fair jobs are about).
    """
    if limit <= 0 or not queues:
        return []
    params = {"queues": list(queues), "limit": limit, "worker": worker, "now": now}
    key = tuple(queues)
    generic = conn in _generic
    # Not pipelined: psycopg's pipeline mode saved round trips but cost more CPU than
    # they did (drain, 3 repetitions each on a quiet machine: 17,207 jobs/s without,
    # 14,471 with; workers + PostgreSQL 108 vs 125 µs per job).
    # In a transaction already (the worker's exchange, after its reports), the claim is part of it:
    # no savepoint (two round trips), as nobody goes on after a failed claim but rolls back. On a
    # connection that plans generically, a claim alone needs no transaction at all: each of its
    # statements is atomic by itself (a claim after a wake-up is then one round trip).
    scope = contextlib.nullcontext() if generic else tx.block(conn, join=True)
    with scope, conn.cursor(row_factory=tuple_row) as cur:
        if not generic:
            cur.execute(q("job_claim_plan"))
        rows = None
        if _flow_seen.get(conn, {}).get(key, -FLOW_MEMORY_SECONDS) + FLOW_MEMORY_SECONDS <= time.monotonic():
            rows = cur.execute(q("job_claim_plain"), params).fetchall()
            if len(rows) == 1 and rows[0][0] is None:
                _flow_seen.setdefault(conn, {})[key] = time.monotonic()
                rows = None
        if rows is None:
            rows = cur.execute(q("job_claim"), params).fetchall()
        return [_claimed(row) for row in rows]


def handed(item: dict[str, Any]) -> ClaimedJob:
    """A job claimed for this worker by the statement that created it (jobs_hand, 34_wake.sql),
    from one element of its notification: what a claim returns, as JSON."""
    values = {name: item.get(name) for name in _CLAIMED_FIELDS}  # no workflow_id: never a step's
    values["id"] = UUID(values["id"])
    return ClaimedJob(**values)


def handed_by_id(conn, ids: list[UUID], worker: str) -> list[ClaimedJob]:
    """The jobs handed to `worker` whose notification named only their ids (too long to carry them)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        return [_claimed(row) for row in cur.execute(q("job_handed"), {"ids": ids, "worker": worker})]


def _claimed(row: tuple) -> ClaimedJob:
    """ClaimedJob(*row), once per claimed job (a row of another length is refused: TypeError)."""
    return ClaimedJob._make(row)


_CLAIMED_FIELDS = ClaimedJob._fields
FLOW_MEMORY_SECONDS = 1.0
# connection -> queues -> when job_claim_plain last said "not plain" (time.monotonic())
_flow_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def plan_generically(conn) -> None:
    """For a connection that claims over and over (a worker's): plan every statement once for the
    session (see job_claim_plan_session), so that its claims skip job_claim_plan and, alone, their
    transaction."""
    conn.execute(q("job_claim_plan_session"))
    _generic.add(conn)


# connections set up by plan_generically
_generic: weakref.WeakSet = weakref.WeakSet()
