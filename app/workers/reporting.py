"""What a worker reports about its jobs: Reports built from outcomes, written in batches one bad report cannot block."""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from qforge.commands import report
from qforge.commands.claim import ClaimedJob
from qforge.commands.report import Outcome, Report
from qforge.workers.connection import TRANSIENT_ERRORS, describe
from qforge.workers.tasks import RESULT_CHECK, TaskError
from qforge.workflows.activation import activate_inline
from qforge.workflows.inline import inline_activations

log = logging.getLogger("qforge.worker")

ERROR_TEXT_LIMIT = 8000  # characters of an error message kept in the Failed event


class JobTimedOut(Exception):
    """The job ran past its timeout_seconds."""


def succeeded(job: ClaimedJob, result: Any) -> Report:
    """The success report, once per finished job."""
    return Report(job.id, job.attempt, result, workflow_id=job.workflow_id)


def failed(job: ClaimedJob, exc: Exception) -> Report:
    """The failure report for what a task raised: reason from TaskError, `timeout`, else `error`."""
    if isinstance(exc, JobTimedOut):
        return Report(job.id, job.attempt, error=str(exc), reason="timeout", workflow_id=job.workflow_id)
    if isinstance(exc, TaskError):
        return Report(job.id, job.attempt, error=error_text(exc.message), reason=exc.reason or "error",
                      result=_storable(exc.result), workflow_id=job.workflow_id)
    return Report(job.id, job.attempt, error=error_text(f"{type(exc).__name__}: {exc}"), reason="error",
                  workflow_id=job.workflow_id)


def write(conn: psycopg.Connection, completions: list[Report], failures: list[Report], *,
          actor: str, join: bool = False) -> tuple[Outcome, Outcome, list[Report]]:
    """Complete and fail in (at most) two batches; a completion whose result is refused fails instead.

    Returns both outcomes and the failure reports written (those converted
    completions included), so the caller's log can name them. With `join`, the
    batches join the caller's transaction and a refused batch raises (the
    caller rolls back and writes again without `join`). A code workflow's function that a report
    wakes runs in the report's transaction when this worker has it (qforge.workflows.inline).
    """
    with inline_activations(activate_inline):
        return _write_both(conn, completions, failures, actor=actor, join=join)


def _write_both(conn: psycopg.Connection, completions: list[Report], failures: list[Report], *,
                actor: str, join: bool) -> tuple[Outcome, Outcome, list[Report]]:
    if join:
        done = report.complete(conn, completions, actor=actor, workflow_ids_known=True, join=True)
        return done, report.fail(conn, failures, actor=actor, workflow_ids_known=True, join=True), failures
    done, unstorable = _write(conn, completions, ok=True, actor=actor)
    failures = failures + unstorable
    failed_outcome, _ = _write(conn, failures, ok=False, actor=actor)
    return done, failed_outcome, failures


def _write(conn: psycopg.Connection, reports: list[Report], *, ok: bool,
           actor: str) -> tuple[Outcome, list[Report]]:
    if not reports:
        return Outcome(), []
    command = report.complete if ok else report.fail
    try:
        return command(conn, reports, actor=actor, workflow_ids_known=True), []
    except TRANSIENT_ERRORS:
        raise
    except psycopg.Error as exc:
        if len(reports) > 1:
            # One report the database refuses (a "\u0000" in a result, say)
            # must not hold back the batch: write them one by one.
            outcome, unstorable = Outcome(), []
            for single in reports:
                one, bad = _write(conn, [single], ok=ok, actor=actor)
                outcome.accepted += one.accepted
                outcome.rejected += one.rejected
                outcome.dead += one.dead
                outcome.retry_at = min(filter(None, (outcome.retry_at, one.retry_at)), default=None)
                unstorable += bad
            return outcome, unstorable
        refused = describe(exc)
    single = reports[0]
    log.warning("job %s: the database refused its report (%s)", single.job_id, refused)
    if ok:
        return Outcome(), [Report(single.job_id, single.attempt, reason="error", workflow_id=single.workflow_id,
                                  error=error_text(f"the task's result could not be stored: {refused}"))]
    if single.result is not None:
        bare = Report(single.job_id, single.attempt, reason=single.reason, error=single.error,
                      workflow_id=single.workflow_id)
        return _write(conn, [bare], ok=False, actor=actor)
    # Nothing left to strip. The job stays running without heartbeats, so the
    # monitor fails it as stale: late, but not lost.
    log.error("job %s: giving up on reporting its failure", single.job_id)
    return Outcome(rejected=[single.job_id]), []


def error_text(text: str) -> str:
    """An error message fit for a text column: no NUL, bounded (the tail, where the cause usually is)."""
    text = text.replace("\x00", "\\0")
    return text if len(text) <= ERROR_TEXT_LIMIT else "..." + text[-ERROR_TEXT_LIMIT:]


def _storable(result: Any) -> Any:
    """A TaskError's partial result if it can go in the event log, else None."""
    if result is None:
        return None
    try:
        RESULT_CHECK.encode(result)
    except (TypeError, ValueError):
        return None
    return result


class FailureLog:
    """Failures for the log: the first batch at once, then at most one summary line per interval.

    A failing dependency can fail every job; one line per batch would then be
    one line per job or two.
    """

    def __init__(self, interval_seconds: float = 5.0) -> None:
        self.interval = interval_seconds
        self.last_line = float("-inf")
        self._reset()

    def _reset(self) -> None:
        self.failed = self.dead = 0
        self.examples: list[Report] = []

    def add(self, reports: list[Report], outcome: Outcome) -> None:
        accepted = set(outcome.accepted)
        self.failed += len(accepted)
        self.dead += len(outcome.dead)
        self.examples += [r for r in reports if r.job_id in accepted][:3 - len(self.examples)]
        self.flush()

    def flush(self, *, force: bool = False) -> None:
        """Write the summary if there is one and the interval has passed (or `force`)."""
        now = time.monotonic()
        if not self.failed or (not force and now - self.last_line < self.interval):
            return
        details = "; ".join(f"{r.job_id}: {r.reason}: {(r.error or '')[:200]}" for r in self.examples)
        more = self.failed - len(self.examples)
        log.info("%d jobs failed (%d dead-lettered): %s%s", self.failed, self.dead, details,
                 f"; and {more} more" if more > 0 else "")
        self.last_line = now
        self._reset()
