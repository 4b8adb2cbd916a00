"""Queue statistics (GET /queues, the dashboard) and log-derived counters (GET /metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from psycopg.rows import dict_row

from qforge.events.states import JOB_READY_EVENTS, PENDING, statuses
from qforge.sql import q

READY_TYPES = sorted(JOB_READY_EVENTS)  # where a claim's latency is measured from

JOB_STATUSES = tuple(sorted(statuses("job")))


def queue_stats(conn) -> list[dict[str, Any]]:
    """Per queue: job counts by status (every status, zeros included) and the age in
    seconds of the oldest pending job that is due (None when none waits)."""
    queues: dict[str, dict[str, Any]] = {}
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("queues_stats"))
        for row in cur.fetchall():
            entry = queues.setdefault(row["queue"], _entry(row["queue"]))
            entry["counts"][row["status"]] = row["n"]
            if row["status"] == PENDING and row["oldest_due_seconds"] is not None:
                entry["oldest_pending_age_seconds"] = round(max(row["oldest_due_seconds"], 0.0), 3)
        # flow control's settings; a configured queue shows even before its first job
        for row in cur.execute(q("queue_settings_list")).fetchall():
            entry = queues.setdefault(row["queue"], _entry(row["queue"]))
            entry.update(paused=row["paused"], rate_per_second=row["rate_per_second"], burst=row["burst"])
    return sorted(queues.values(), key=lambda entry: entry["queue"])


def log_positions_left(conn) -> int:
    """Positions the log's partitions can still take: the monitor's leader keeps partitions
    made ahead (log_maintain); without it, appends fail once this reaches 0."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(q("log_positions_left")).fetchone()["left"]


def _entry(queue: str) -> dict[str, Any]:
    return {"queue": queue, "counts": {s: 0 for s in JOB_STATUSES}, "oldest_pending_age_seconds": None,
            "paused": False, "rate_per_second": None, "burst": None}


@dataclass
class LogTally:
    """Totals folded from the event log since a gapless cursor (see events_counts_after).

    `bucket_counts[i]` counts claims whose latency is <= bounds[i] (cumulative, as
    Prometheus wants them).
    """

    bounds: tuple[float, ...]
    cursor: tuple[int, int] = (0, 0)
    by_type: dict[str, int] = field(default_factory=dict)
    bucket_counts: list[int] = field(default_factory=list)
    claims: int = 0
    latency_sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.bucket_counts:
            self.bucket_counts = [0] * len(self.bounds)


def tally_log(conn, tally: LogTally, *, page: int = 20_000, max_pages: int = 50) -> LogTally:
    """Fold the events that became visible since tally.cursor into the tally (in place)."""
    for _ in range(max_pages):
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(q("events_counts_after"), {
                "after_xid": str(tally.cursor[0]), "after_position": tally.cursor[1],
                "limit": page, "bounds": list(tally.bounds), "ready_types": READY_TYPES})
            row = cur.fetchone()
        if not row["read"]:
            break
        for event_type, count in (row["counts"] or {}).items():
            tally.by_type[event_type] = tally.by_type.get(event_type, 0) + count
        for index, count in enumerate(row["buckets"] or []):
            tally.bucket_counts[index] += count
        tally.claims += row["claims"]
        tally.latency_sum += row["latency_sum"]
        tally.cursor = (int(row["last_xid"]), row["last_position"])
        if row["read"] < page:
            break
    return tally


def database_ok(conn) -> bool:
    with conn.cursor() as cur:
        cur.execute(q("database_ping"))
        return cur.fetchone() is not None
