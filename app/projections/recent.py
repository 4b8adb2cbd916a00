"""The last 15 minutes for the dashboard's charts (GET /stats/recent), kept by each API process.

Finished attempts by outcome and enqueue-to-start latency are folded from the log through the
gapless cursor (nothing scans jobs): on first use from some way back in the log, then only what
was appended since. Queue depth is not in the log as such; it is sampled from the queue counts
each time the stats are asked for (the dashboard asks every few seconds).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from psycopg.rows import dict_row

from qforge.events import store
from qforge.events.states import PENDING
from qforge.projections.stats import READY_TYPES, queue_stats
from qforge.sql import q

WINDOW_SECONDS = 15 * 60
BUCKET_SECONDS = 10
# On first use, start this many events before the live tail: enough for 15 minutes at a
# few hundred events/s; older events are read but fall outside the window.
START_BACK = 100_000
PAGE = 20_000
MAX_PAGES = 20  # per request; a backlog beyond that is caught up by the next requests
OUTCOMES = {"Succeeded": "succeeded", "Failed": "failed", "DeadLettered": "dead", "Cancelled": "cancelled"}
DEPTH_EVERY_SECONDS = 2.0


def bin_upper_seconds(bin_: int) -> float:
    """The upper edge of a latency bin of events_recent_after (bin 0: under 1 ms)."""
    return 0.001 * 10 ** (bin_ / 10)


def percentile(histogram: dict[int, int], share: float) -> float | None:
    total = sum(histogram.values())
    if not total:
        return None
    wanted, seen = share * total, 0
    for bin_ in sorted(histogram):
        seen += histogram[bin_]
        if seen >= wanted:
            return round(bin_upper_seconds(bin_), 4)
    return None


class RecentStats:
    """Per-bucket counts for the last WINDOW_SECONDS; thread-safe (routes run in a thread pool)."""

    def __init__(self) -> None:
        self.cursor: tuple[int, int] | None = None
        self.outcomes: dict[int, dict[str, int]] = collections.defaultdict(dict)
        self.latency: dict[int, dict[int, int]] = collections.defaultdict(dict)
        self.depth: collections.deque[tuple[float, dict[str, int]]] = collections.deque()
        self.lock = threading.Lock()

    def _catch_up(self, conn) -> None:
        if self.cursor is None:
            self.cursor = store.tail_cursor(conn, back=START_BACK)
        for _ in range(MAX_PAGES):
            with conn.cursor(row_factory=dict_row) as cur:
                cur.execute(q("events_recent_after"), {
                    "after_xid": str(self.cursor[0]), "after_position": self.cursor[1], "limit": PAGE,
                    "bucket": BUCKET_SECONDS, "window": WINDOW_SECONDS, "ready_types": READY_TYPES})
                row = cur.fetchone()
            if not row["read"]:
                return
            for slot, event_type, count in row["outcomes"] or []:
                name = OUTCOMES[event_type]
                self.outcomes[slot][name] = self.outcomes[slot].get(name, 0) + count
            for slot, bin_, count in row["latencies"] or []:
                self.latency[slot][bin_] = self.latency[slot].get(bin_, 0) + count
            self.cursor = (int(row["last_xid"]), row["last_position"])
            if row["read"] < PAGE:
                return

    def _sample_depth(self, conn, now: float) -> None:
        if self.depth and now - self.depth[-1][0] < DEPTH_EVERY_SECONDS:
            return
        pending = {entry["queue"]: entry["counts"].get(PENDING, 0) for entry in queue_stats(conn)}
        self.depth.append((now, pending))

    def _forget(self, now: float) -> None:
        oldest_slot = int((now - WINDOW_SECONDS) // BUCKET_SECONDS)
        for table in (self.outcomes, self.latency):
            for slot in [s for s in table if s < oldest_slot]:
                del table[slot]
        while self.depth and self.depth[0][0] < now - WINDOW_SECONDS:
            self.depth.popleft()

    def snapshot(self, conn) -> dict[str, Any]:
        """The charts' data: one entry per bucket of the window (zeros included), oldest first."""
        with self.lock:
            now = time.time()
            self._catch_up(conn)
            self._sample_depth(conn, now)
            self._forget(now)
            last = int(now // BUCKET_SECONDS)
            slots = range(last - WINDOW_SECONDS // BUCKET_SECONDS + 1, last + 1)
            throughput = [{"t": slot * BUCKET_SECONDS,
                           **{name: round(self.outcomes.get(slot, {}).get(name, 0) / BUCKET_SECONDS, 3)
                              for name in OUTCOMES.values()}} for slot in slots]
            latency = []
            for slot in slots:
                histogram = self.latency.get(slot, {})
                latency.append({"t": slot * BUCKET_SECONDS, "count": sum(histogram.values()),
                                "p50": percentile(histogram, 0.5), "p99": percentile(histogram, 0.99)})
            depth = [{"t": round(at, 3), "queues": queues} for at, queues in self.depth]
            return {"now": round(now, 3), "window_seconds": WINDOW_SECONDS, "bucket_seconds": BUCKET_SECONDS,
                    "throughput": throughput, "latency": latency, "depth": depth}
