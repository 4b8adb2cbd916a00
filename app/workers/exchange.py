"""The worker's round trips: buffered results written and new jobs claimed in one transaction, batched heartbeats.

`Exchanges` is mixed into `qforge.workers.worker.Worker` and works on its
buffers (`completions`, `failures`), its running jobs and its database thread (`_db`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import psycopg

from qforge.commands import report, workers
from qforge.commands.claim import ClaimedJob, claim
from qforge.commands.report import Outcome, Report
from qforge.workers import reporting
from qforge.workers.connection import TRANSIENT_ERRORS

log = logging.getLogger("qforge.worker")

STATS_EVERY_SECONDS = 60.0


@dataclass
class Stats:
    succeeded: int = 0
    failed: int = 0
    since: float = field(default_factory=time.monotonic)


class Exchanges:
    """Writing results, claiming jobs and heartbeating, each in as few round trips as it can."""

    async def _exchange(self, claim_limit: int = 0) -> None:
        """Write the buffered results and claim up to `claim_limit` new jobs, in one transaction."""
        completions, failures = self.completions, self.failures
        self.completions, self.failures = [], []
        # The slots the claim may fill, taken before the round trip: jobs handed to this worker
        # meanwhile (wakeups._handed) find them gone and are handed back, not started twice over.
        slots = [self.free_slots.pop() for _ in range(min(claim_limit, len(self.free_slots)))]
        claim_limit = len(slots)
        # Cleared before the round trip: a notification that lands meanwhile sets it again.
        self.claim_wanted = self.claim_wanted and not claim_limit
        try:
            done, failed, written, jobs = await self._db(self._exchange_sync, completions, failures, claim_limit)
        except BaseException:
            # Kept for the next turn. If the lost round trip had committed, the
            # retry is rejected by the (job_id, attempt) fence and changes nothing.
            self.completions[:0] = completions
            self.failures[:0] = failures
            self.free_slots.extend(reversed(slots))
            self.claim_wanted = self.claim_wanted or bool(claim_limit)
            raise
        self.stats.succeeded += len(done.accepted)
        self.stats.failed += len(failed.accepted)
        if failed.retry_at is not None:
            # Look again when the earliest retry is due, not at the next poll:
            # a 100 ms backoff should not become a 1 s one.
            due = time.monotonic() + max(0.0, (failed.retry_at - datetime.now(timezone.utc)).total_seconds())
            self.retry_due = due if self.retry_due is None else min(self.retry_due, due)
        if failed.accepted:
            self.failure_log.add(written, failed)
        rejected = len(done.rejected) + len(failed.rejected)
        if rejected:
            log.info("%d results not recorded: their jobs were cancelled, recovered by the monitor"
                     " or already reported", rejected)
        if claim_limit and len(jobs) >= claim_limit:
            self.claim_wanted = True  # a full batch: more are probably waiting
        if claim_limit:
            log.debug("claimed %d jobs of %d", len(jobs), claim_limit)
        for job, slot in zip(jobs, slots):
            self._start(job, slot)
        self.free_slots.extend(reversed(slots[len(jobs):]))
        if claim_limit and len(jobs) < claim_limit:
            await self._wait_for_work()  # after the jobs started: the row costs them nothing

    def _exchange_sync(self, conn: psycopg.Connection, completions: list[Report], failures: list[Report],
                       claim_limit: int) -> tuple[Outcome, Outcome, list[Report], list[ClaimedJob]]:
        if not (completions or failures):
            # A claim alone (the connection plans generically): one statement, no transaction.
            return Outcome(), Outcome(), [], claim(conn, self.queues, claim_limit, self.name)
        try:
            return self._exchange_once(conn, completions, failures, claim_limit, join=True)
        except TRANSIENT_ERRORS:
            raise
        except psycopg.Error:
            # Rolled back whole. Once more with a savepoint per command, so that a report the
            # database refuses (a "\u0000" in a result, say) is written on its own and the rest go in.
            return self._exchange_once(conn, completions, failures, claim_limit, join=False)

    def _exchange_once(self, conn: psycopg.Connection, completions: list[Report], failures: list[Report],
                       claim_limit: int, *, join: bool) -> tuple[Outcome, Outcome, list[Report], list[ClaimedJob]]:
        # One commit for both: with synchronous commit each one waits for a
        # WAL flush, which is most of a small batch's cost. With `join` the
        # commands' statements join this transaction (no savepoints: two
        # round trips each) and any failure rolls it all back; without, they
        # become savepoints and reporting.write gets past a refused report.
        # If the claim fails, the results roll back with it and are sent again.
        with conn.transaction():
            done, failed, written = reporting.write(conn, completions, failures, actor=self.name, join=join)
            jobs = claim(conn, self.queues, claim_limit, self.name) if claim_limit else []
        return done, failed, written, jobs

    async def _beat(self) -> None:
        """One batched Heartbeat for the jobs that need one, and the registry row; stop rejected jobs."""
        now = time.monotonic()
        # A job claimed (or beaten) less than half an interval ago is still fresh
        # at the next tick, so short jobs never write a Heartbeat at all.
        due = [run for run in self.running.values()
               if not run.abandoned and now - run.beat_at >= self.settings.heartbeat_seconds / 2]
        reports = [Report(run.job.id, run.job.attempt) for run in due]
        outcome = await self._db(self._beat_sync, reports, self._snapshot())
        rejected = set(outcome.rejected)
        for run in due:
            if run.job.id not in rejected:
                run.beat_at = now
            elif self.running.get(run.job.id) is run:
                log.info("job %s (%s) attempt %d was cancelled or taken over: stopping it",
                         run.job.id, run.job.task, run.job.attempt)
                self._abandon(run)
        self.failure_log.flush()
        if now - self.stats.since >= STATS_EVERY_SECONDS:
            if self.stats.succeeded or self.stats.failed:
                log.info("last %.0fs: %d succeeded, %d failed; %d running", now - self.stats.since,
                         self.stats.succeeded, self.stats.failed, len(self.running))
            self.stats = Stats()

    def _beat_sync(self, conn: psycopg.Connection, reports: list[Report],
                   snapshot: list[dict[str, Any]]) -> Outcome:
        outcome = report.heartbeat(conn, reports, actor=self.name)
        workers.record(conn, self.info, snapshot)
        return outcome

    def _snapshot(self) -> list[dict[str, Any]]:
        return [{"job_id": str(run.job.id), "task": run.job.task, "step": run.job.step,
                 "workflow_id": str(run.job.workflow_id) if run.job.workflow_id else None,
                 "started_at": datetime.fromtimestamp(run.started_at, timezone.utc).isoformat(), "slot": run.slot}
                for run in self.running.values() if not run.abandoned]

