"""Read side of the worker registry: live workers (GET /workers) and worker slots as pods (GET /pods)."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row

from qforge.sql import q


def live_workers(conn, stale_seconds: float) -> list[dict[str, Any]]:
    """Workers that heartbeated within stale_seconds, by name.

    Each: {name, host, pid, queues, concurrency, running, last_seen, started_at};
    `running` lists {job_id, task, step, workflow_id, started_at, slot} as of last_seen.
    """
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("workers_live"), {"stale_seconds": stale_seconds})
        rows = cur.fetchall()
    return [{**row, "queues": list(row["queues"]), "running": list(row["running"] or [])}
            for row in rows]


def pods(conn, stale_seconds: float) -> dict[str, Any]:
    """Worker slots in the shape of the pod orchestrator's GET /pods.

    A slot is a pod: total = live slots, leased = "<worker>/slot-<n>" for each busy one.
    """
    total, leased = 0, []
    for worker in live_workers(conn, stale_seconds):
        total += worker["concurrency"]
        for index, job in enumerate(worker["running"]):
            slot = job.get("slot", index) if isinstance(job, dict) else index
            leased.append(f"{worker['name']}/slot-{slot}")
    return {"total": total, "available": max(total - len(leased), 0), "leased": leased}
