"""Prometheus metrics, computed from the database at scrape time.

The API process runs no jobs, so it cannot count claims as they happen; the
log can. Each API process folds the events that became visible since its last
scrape into running totals (LogTally, through the same gapless cursor as the
event stream), so the counters are exact, monotonic, equal in every API
process, and a scrape costs only the events since the previous one (the first
scrape of a process reads the whole log once).

- qforge_queue_depth{queue,status}: jobs in each status now (gauge).
- qforge_queue_oldest_pending_age_seconds{queue}: wait of the oldest due pending job.
- qforge_events_total{type}: events appended, by type, since the log began.
- qforge_jobs_claimed_total / _succeeded_total / _failed_total (failed attempts,
  retried or not) / _retried_total / _dead_lettered_total: the same, by name.
- qforge_claim_latency_seconds: Claimed time minus the moment the job became
  claimable (the run_at of the Enqueued, StepUnblocked, Retried or Released
  event before it), i.e. how long due work waited for a worker.
- qforge_workers_live, qforge_worker_slots{state="total"|"busy"}: the worker registry.
- qforge_log_positions_left: events the log's partitions can still take. The
  monitor's leader keeps partitions made ahead; if no monitor runs, this falls
  and appends fail when it reaches 0 (alert well before: below one partition).
"""

from __future__ import annotations

import threading
from typing import Iterator

from prometheus_client.core import (CollectorRegistry, CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)

from qforge.api.deps import Resources
from qforge.projections.stats import LogTally, log_positions_left, queue_stats, tally_log
from qforge.projections.workers import live_workers

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0)
NAMED_COUNTERS = {"Claimed": "claimed", "Succeeded": "succeeded", "Failed": "failed",
                  "Retried": "retried", "DeadLettered": "dead_lettered"}


class QForgeCollector:
    def __init__(self, resources: Resources):
        self.resources = resources
        self.tally = LogTally(bounds=LATENCY_BUCKETS)
        self._lock = threading.Lock()  # one fold at a time; scrapes may overlap

    def describe(self) -> list[Metric]:
        return []  # computed at scrape time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        stale_seconds = self.resources.settings.stale_seconds
        with self.resources.read_connection() as conn:
            queues = queue_stats(conn)
            workers = live_workers(conn, stale_seconds)
            left = log_positions_left(conn)
            with self._lock:
                tally_log(conn, self.tally)
                by_type = dict(self.tally.by_type)
                buckets = list(self.tally.bucket_counts)
                claims, latency_sum = self.tally.claims, self.tally.latency_sum

        depth = GaugeMetricFamily("qforge_queue_depth", "Jobs in each status, by queue.",
                                  labels=["queue", "status"])
        oldest = GaugeMetricFamily("qforge_queue_oldest_pending_age_seconds",
                                   "How long the oldest due pending job of a queue has waited.",
                                   labels=["queue"])
        for queue in queues:
            for status, count in queue["counts"].items():
                depth.add_metric([queue["queue"], status], count)
            oldest.add_metric([queue["queue"]], queue["oldest_pending_age_seconds"] or 0.0)
        yield depth
        yield oldest

        events = CounterMetricFamily("qforge_events", "Events appended to the log, by type.",
                                     labels=["type"])
        for event_type, count in sorted(by_type.items()):
            events.add_metric([event_type], count)
        yield events
        for event_type, name in NAMED_COUNTERS.items():
            yield CounterMetricFamily(f"qforge_jobs_{name}",
                                      f"{event_type} events in the log (jobs and workflow steps).",
                                      value=by_type.get(event_type, 0))
        yield HistogramMetricFamily(
            "qforge_claim_latency_seconds",
            "From when a job became claimable (its run_at) to its Claimed event.",
            buckets=[(repr(bound), count) for bound, count in zip(LATENCY_BUCKETS, buckets)]
            + [("+Inf", claims)], sum_value=latency_sum)

        yield GaugeMetricFamily("qforge_workers_live", "Workers heartbeating within the stale limit.",
                                value=len(workers))
        slots = GaugeMetricFamily("qforge_worker_slots", "Job slots of live workers.",
                                  labels=["state"])
        slots.add_metric(["total"], sum(w["concurrency"] for w in workers))
        slots.add_metric(["busy"], sum(len(w["running"]) for w in workers))
        yield slots
        yield GaugeMetricFamily("qforge_log_positions_left",
                                "Events the log's partitions can still take (the monitor makes more ahead).",
                                value=left)


def make_registry(resources: Resources) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QForgeCollector(resources))
    return registry
