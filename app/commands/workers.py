"""Worker commands: keep the worker registry (plain operational state) and hand jobs back on shutdown."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import tuple_row

from qforge.commands.report import Outcome, Report
from qforge.sql import q


@dataclass(frozen=True)
class WorkerInfo:
    """What the registry knows about a worker process besides its running jobs."""

    name: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    tasks: tuple[str, ...] | None = None  # what it can run (GET /queues warns of tasks none registers)


def record(conn, worker: WorkerInfo, running: list[dict[str, Any]]) -> None:
    """Upsert the worker's row: alive now, running these jobs.

    Not an event: the registry is overwritten every heartbeat tick and is no
    part of any job's history (see migrations/0003_workers.sql).
    """
    conn.execute(q("worker_record"), {
        "name": worker.name, "host": worker.host, "pid": worker.pid,
        "queues": list(worker.queues), "concurrency": worker.concurrency,
        "running": json.dumps(running), "started_at": worker.started_at,
        "tasks": list(worker.tasks) if worker.tasks is not None else None,
    })


def stop(conn, name: str) -> None:
    """Mark a worker stopped after a clean shutdown (it leaves the live list at once)."""
    conn.execute(q("worker_stop"), {"name": name})


def mark_gone(conn, *, stale_seconds: float) -> list[str]:
    """Mark workers silent for longer than stale_seconds as gone; returns their names."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(q("workers_mark_gone"), {"stale_seconds": stale_seconds})
        return sorted(row[0] for row in cur.fetchall())


def release(conn, reports: list[Report], *, actor: str, reason: str = "shutdown",
            now: datetime | None = None) -> Outcome:
    """Hand running jobs back to pending (Released) without using up their attempt.

    Fenced by (job_id, attempt) like every report: a job cancelled or recovered
    and re-claimed meanwhile comes back in `rejected`, unchanged. Nothing
    finishes here, so no workflow needs advancing (or locking).
    """
    if not reports:
        return Outcome()
    rows = [{"id": str(r.job_id), "attempt": r.attempt} for r in reports]
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(q("job_release"), {"reports": json.dumps(rows), "actor": actor,
                                       "reason": reason, "now": now})
        released = {row[0] for row in cur.fetchall()}
    return Outcome(accepted=[r.job_id for r in reports if r.job_id in released],
                   rejected=[r.job_id for r in reports if r.job_id not in released])
