"""Due work that no live worker takes: a queue no worker serves, a task no worker of its queue
registers (GET /queues, GET /jobs/{id}, the monitor's log). A newcomer's jobs on queue "b" under
`qforge dev` (whose pools serve "default") otherwise wait for ever without a word."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row

from qforge.events.states import PENDING
from qforge.projections.workers import live_workers
from qforge.sql import q


def _serving(workers: list[dict[str, Any]], queue: str) -> list[dict[str, Any]]:
    return [w for w in workers if queue in w["queues"]]


def _registers(worker: dict[str, Any], task: str) -> bool:
    # A worker of an older release registered no task list: it may run anything.
    return worker.get("tasks") is None or task in worker["tasks"]


def unserved_queue(queue: str, due: int) -> str:
    return (f"queue '{queue}' has {due} due job{'s' if due != 1 else ''} and no live worker serves it: "
            f"start one with qforge worker --queues {queue} (or qforge dev --queues default,{queue})")


def unknown_task(queue: str, task: str) -> str:
    return (f"no live worker of queue '{queue}' registers task '{task}': start one with "
            f"qforge worker --queues {queue} --tasks <the module that defines it>")


def unserved(conn, stats: list[dict[str, Any]], stale_seconds: float) -> dict[str, list[tuple[str, str]]]:
    """Per queue of `stats` (queue_stats' entries): live workers serving it, and its warnings as
    (subject, text): the subject stays the same while the warning holds (the count in the text
    does not), for the monitor's once-a-minute log."""
    workers = live_workers(conn, stale_seconds)
    due = {entry["queue"]: entry["counts"].get(PENDING, 0) for entry in stats
           if entry.get("oldest_pending_age_seconds") is not None and not entry.get("paused")}
    tasks: dict[str, list[str]] = {}
    served = [queue for queue in due if _serving(workers, queue)]
    if served:
        with conn.cursor(row_factory=dict_row) as cur:
            for row in cur.execute(q("queue_due_tasks"), {"queues": served}).fetchall():
                tasks.setdefault(row["queue"], []).append(row["task"])
    found: dict[str, list[tuple[str, str]]] = {}
    for queue in due:
        serving = _serving(workers, queue)
        warnings = found.setdefault(queue, [])
        if not serving:
            warnings.append((f"queue {queue}", unserved_queue(queue, due[queue])))
        warnings += [(f"queue {queue} task {task}", unknown_task(queue, task)) for task in tasks.get(queue, [])
                     if not any(_registers(w, task) for w in serving)]
    return found


def queue_warnings(conn, stats: list[dict[str, Any]], stale_seconds: float) -> None:
    """Add to each GET /queues entry `workers` (live workers serving it) and `warnings`."""
    workers = live_workers(conn, stale_seconds)
    found = unserved(conn, stats, stale_seconds)
    for entry in stats:
        entry["workers"] = len(_serving(workers, entry["queue"]))
        entry["warnings"] = [text for _, text in found.get(entry["queue"], [])]


def job_warning(conn, job: dict[str, Any], stale_seconds: float) -> str | None:
    """Why a pending job may wait for a worker that is not there; None when one would take it."""
    if job.get("status") != PENDING:
        return None
    serving = _serving(live_workers(conn, stale_seconds), job["queue"])
    if not serving:
        return (f"no live worker serves queue '{job['queue']}': start one with qforge worker "
                f"--queues {job['queue']} (or qforge dev --queues default,{job['queue']})")
    if not any(_registers(w, job["task"]) for w in serving):
        return unknown_task(job["queue"], job["task"])
    return None
