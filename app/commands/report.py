"""What workers (and the monitor) report about running jobs: heartbeat, complete, fail.

All three are fenced by (job_id, attempt) and work on batches in one statement.
A report for a superseded attempt or a finished job changes nothing and comes
back in `rejected`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from psycopg.rows import tuple_row

from qforge.commands import tx
from qforge.workflows.engine import advance
from qforge.workflows.rows import load_many
from qforge.settings import get_settings
from qforge.sql import q

JITTER_RATIO = 0.1  # up to +10 % of the backoff delay


class Report(NamedTuple):
    """What a worker (or the monitor) says about one attempt. A named tuple rather than a frozen
    dataclass, as a worker makes one per finished job (~0.5 µs instead of ~1.5)."""

    job_id: UUID
    attempt: int
    result: Any = None
    error: str | None = None
    reason: str = "error"  # error | timeout | heartbeat_timeout | ...
    workflow_id: UUID | None = None  # known by workers from the claim; else looked up


# Failures that another attempt cannot mend: the job dead-letters at once, its retries unused.
# unknown_task: no module the worker loaded registers the task (a retry would find none either).
PERMANENT_REASONS = frozenset({"unknown_task"})


@dataclass
class Outcome:
    accepted: list[UUID] = field(default_factory=list)
    rejected: list[UUID] = field(default_factory=list)
    dead: list[UUID] = field(default_factory=list)  # failures that dead-lettered
    retry_at: datetime | None = None  # the earliest run_at of the failures that will retry


def _lock_workflows(cur, reports: list[Report], known: bool) -> list[UUID]:
    """Lock the workflows of step jobs first: everyone locks a workflow before its jobs."""
    if known:
        workflow_ids = sorted({r.workflow_id for r in reports if r.workflow_id})
    else:
        cur.execute(q("job_workflow_ids"), {"ids": [r.job_id for r in reports]})
        workflow_ids = sorted(row[0] for row in cur.fetchall())
    if workflow_ids:
        # a cursor of its own: in complete's pipeline, cur's result is the completion's
        cur.connection.execute(q("workflow_lock"), {"ids": workflow_ids})
    return workflow_ids


def _split(reports: list[Report], accepted: set[UUID]) -> Outcome:
    return Outcome(accepted=[r.job_id for r in reports if r.job_id in accepted],
                   rejected=[r.job_id for r in reports if r.job_id not in accepted])


def heartbeat(conn, reports: list[Report], *, actor: str, now: datetime | None = None) -> Outcome:
    if not reports:
        return Outcome()
    rows = [{"id": str(r.job_id), "attempt": r.attempt} for r in reports]
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(q("job_heartbeat"), {"reports": json.dumps(rows), "actor": actor, "now": now})
        return _split(reports, {row[0] for row in cur.fetchall()})


def complete(conn, reports: list[Report], *, actor: str, now: datetime | None = None,
             workflow_ids_known: bool = False, join: bool = False) -> Outcome:
    """Record Succeeded for each current attempt; advance the workflows of steps. With `join`,
    inside the caller's transaction without a savepoint (see tx.block)."""
    if not reports:
        return Outcome()
    # r.job_id.hex: 32 hex digits, which uuid input reads as well (str() costs twice as much)
    rows = [{"id": r.job_id.hex, "attempt": r.attempt, "result": r.result} for r in reports]
    with tx.block(conn, join=join), conn.cursor(row_factory=tuple_row) as cur:
        loaded = None
        if workflow_ids_known and any(r.workflow_id for r in reports):
            # The lock, the completions and the rows of the workflows they advance (read after
            # the completions, under the lock) in one round trip, not one read per workflow.
            with conn.pipeline():
                locked = _lock_workflows(cur, reports, True)
                cur.execute(q("job_complete"), {"reports": json.dumps(rows), "actor": actor, "now": now})
                read = load_many(conn, locked)
            loaded = read()
        else:
            locked = _lock_workflows(cur, reports, workflow_ids_known)
            cur.execute(q("job_complete"), {"reports": json.dumps(rows), "actor": actor, "now": now})
        done = cur.fetchall()
        # One row per report taken (a job's Succeeded), so as many rows as reports means all of
        # them: spared hashing every id twice (a worker's batch is usually taken whole).
        outcome = (Outcome(accepted=[r.job_id for r in reports]) if len(done) == len(reports)
                   else _split(reports, {row[0] for row in done}))
        _advance(conn, locked, {row[1] for row in done if row[1]}, now, loaded)
    return outcome


def fail(conn, reports: list[Report], *, actor: str, now: datetime | None = None,
         workflow_ids_known: bool = False, join: bool = False) -> Outcome:
    """Record Failed, then Retried with backoff or DeadLettered, for each current attempt (`join`:
    see complete)."""
    if not reports:
        return Outcome()
    settings = get_settings()
    rows = [{"id": str(r.job_id), "attempt": r.attempt, "reason": r.reason,
             "error": r.error or "failed", "result": r.result,
             "permanent": r.reason in PERMANENT_REASONS} for r in reports]
    with tx.block(conn, join=join), conn.cursor(row_factory=tuple_row) as cur:
        locked = _lock_workflows(cur, reports, workflow_ids_known)
        cur.execute(q("job_fail"), {
            "reports": json.dumps(rows), "actor": actor, "now": now,
            "base": settings.backoff_base_seconds, "cap": settings.backoff_cap_seconds,
            "jitter": JITTER_RATIO,
        })
        written = cur.fetchall()
        outcome = _split(reports, {row[0] for row in written})
        outcome.dead = [row[0] for row in written if row[1] == "DeadLettered"]
        outcome.retry_at = min((row[3] for row in written if row[3] is not None), default=None)
        finished_workflows = {row[2] for row in written if row[1] == "DeadLettered" and row[2]}
        _advance(conn, locked, finished_workflows, now)
    return outcome


def _advance(conn, locked: list[UUID], workflow_ids: set[UUID], now: datetime | None,
             loaded: dict | None = None) -> None:
    if not workflow_ids:
        return
    missing = workflow_ids - set(locked)
    if missing:  # a caller that said it knew the workflows did not: never advance unlocked
        raise RuntimeError(f"workflows {sorted(missing)} were not locked before their steps")
    advance(conn, sorted(workflow_ids), now=now, loaded=loaded)
