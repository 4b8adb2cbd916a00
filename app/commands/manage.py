"""Operator commands on one job: cancel it, retry it (dead or cancelled -> pending)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from uuid import UUID

from psycopg.rows import dict_row

from qforge.workflows.engine import advance
from qforge.commands.errors import Conflict, NotFound
from qforge.commands.report import Report, fail
from qforge.workflows.resume import reopen_step
from qforge.events import store
from qforge.events import types as ev
from qforge.events.states import JOB_ACTIVE, allows
from qforge.events.transitions import job_cancelled, job_retried_by_hand
from qforge.sql import q


def _lock(cur, job_id: UUID) -> dict:
    """Lock the job (its workflow first, the global lock order) and return its row."""
    cur.execute(q("job_get"), {"id": job_id})
    row = cur.fetchone()
    if row is None:
        raise NotFound(f"job {job_id} not found")
    if row["workflow_id"]:
        cur.execute(q("workflow_lock"), {"ids": [row["workflow_id"]]})
    cur.execute(q("job_lock"), {"ids": [job_id]})
    return cur.fetchone()


def cancel_job(conn, job_id: UUID, *, actor: str = "api", now: datetime | None = None) -> None:
    """Cancel a job that has not finished; a running one stops at its next heartbeat."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        row = _lock(cur, job_id)
        if not allows("job", row["status"], ev.Cancelled.type):
            raise Conflict(f"job {job_id} is {row['status']} and cannot be cancelled")
        store.append(conn, job_cancelled(row, "cancelled by " + actor), actor=actor, now=now)
        if row["workflow_id"]:
            advance(conn, [row["workflow_id"]], now=now, actor=actor)


def retry_job(conn, job_id: UUID, *, actor: str = "api", now: datetime | None = None) -> None:
    """Run a dead or cancelled job again, with a fresh retry budget (a workflow's step: with the
    steps downstream that its end skipped, re-opening the workflow if it had ended)."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        row = _lock(cur, job_id)
        if row["status"] in JOB_ACTIVE or not allows("job", row["status"], ev.Retried.type):
            raise Conflict(f"job {job_id} is {row['status']}; only a dead or cancelled job can be retried")
        if row["workflow_id"]:
            # a step runs again as part of its workflow: what its end skipped runs again too
            reopen_step(conn, cur, row["workflow_id"], row["step"], actor=actor, now=now)
            return
        clock = now or datetime.now(timezone.utc)
        store.append(conn, job_retried_by_hand(row, clock), actor=actor, now=now)


def recover_stale(conn, *, stale_seconds: float, now: datetime | None = None,
                  limit: int = 100, actor: str = "monitor") -> list[UUID]:
    """Fail running jobs whose heartbeat is older than stale_seconds (reason heartbeat_timeout).

    It counts as an attempt: the job is Retried or DeadLettered like any failure.
    """
    clock = now or datetime.now(timezone.utc)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("job_stale"), {"cutoff": clock - timedelta(seconds=stale_seconds),
                                     "limit": limit})
        stale = cur.fetchall()
    if not stale:
        return []
    reports = [Report(job_id=row["id"], attempt=row["attempt"], reason="heartbeat_timeout",
                      error=f"no heartbeat from worker {row['worker']} for over {stale_seconds:g}s",
                      workflow_id=row["workflow_id"]) for row in stale]
    # workflow ids came from an unlocked read; fail() re-reads them under lock.
    return fail(conn, reports, actor=actor, now=now).accepted
