"""The worker process: claims jobs in batches, runs them in N slots, reports in batches, heartbeats, stops gracefully.

One asyncio loop owns all state. Tasks run as asyncio tasks (sync ones in a
thread pool of `concurrency` threads). Every database call goes through one
sync connection on one dedicated thread, so calls are serialized without a
lock and the loop never blocks on the network; a second (async) connection
only LISTENs, because a connection waiting for notifications blocks others.

Each turn of the loop: heartbeat when due, then one transaction that writes
the buffered results (when busy, results that finish during a round trip pile
up and go in one statement) and claims as many jobs as there are free slots,
then sleep until a job finishes, a notification arrives, a signal comes or a
timer is due. A notification of jobs due later (a delayed job, a retry) sets a
timer on when they come due, so they start then, not at the next poll.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, TypeVar
from uuid import UUID

import psycopg
from psycopg import sql

from qforge import tracing
from qforge.commands import report, workers
from qforge.commands.claim import ClaimedJob, claim, plan_generically
from qforge.commands.report import Outcome, Report
from qforge.events.store import JOBS_CHANNEL
from qforge.settings import Settings, get_settings
from qforge.sql import q
from qforge.workers.sandbox import TaskPolicy
from qforge.workers import isolation, reporting
from qforge.workers.connection import TRANSIENT_ERRORS, Backoff, Reconnecting, connect_async, describe
from qforge.workers.executors import execute
from qforge.workers.tasks import TaskContext, registered_task_names
from qforge.workflows import activation, durable
from qforge.workflows import journal as code_journal

log = logging.getLogger("qforge.worker")

T = TypeVar("T")

STATS_EVERY_SECONDS = 60.0
# Due times of delayed jobs kept for timers (the earliest ones; the poll finds any beyond).
MAX_TIMERS = 1000
# How long a stopping worker keeps retrying its last reports while the database is away.
FINAL_REPORT_RETRY_SECONDS = 30.0
# Cancelled tasks get this long to clean up (a shell command's group gets SIGTERM, then SIGKILL after 2 s).
TASK_STOP_WAIT_SECONDS = 5.0


@dataclass(eq=False)
class Running:
    """A job in a slot."""

    job: ClaimedJob
    slot: int
    started_at: datetime
    beat_at: float  # monotonic time of the last recorded Claimed/Heartbeat
    task: asyncio.Task | None = None
    abandoned: bool = False  # stopped by the worker: whatever it returns is not reported


@dataclass
class Stats:
    succeeded: int = 0
    failed: int = 0
    since: float = field(default_factory=time.monotonic)


class Worker:
    def __init__(self, url: str, *, name: str, queues: list[str], concurrency: int,
                 allow_shell: bool = False, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.url = url
        self.name = name
        self.queues = queues
        self.queue_set = frozenset(queues)
        self.concurrency = concurrency
        self.allow_shell = allow_shell
        # Shell steps apart from the worker (IsolationError when the settings cannot be honoured);
        # not dumpable, so a step that runs as this same user cannot read /proc/<worker>/environ.
        self.task_policy = TaskPolicy.from_settings(self.settings, shell=allow_shell)
        self.undumpable = allow_shell and isolation.make_undumpable()
        self.info = workers.WorkerInfo(name=name, host=socket.gethostname(), pid=os.getpid(),
                                       queues=queues, concurrency=concurrency,
                                       started_at=datetime.now(timezone.utc),
                                       tasks=tuple(sorted({*registered_task_names(), "http",
                                                           *(["shell"] if allow_shell else [])})))
        self.db = Reconnecting(url, f"qforge-worker {name}", setup=plan_generically)
        self.db_thread = ThreadPoolExecutor(1, thread_name_prefix="qforge-db")
        # Runs of code workflows read their workflow's rows on a connection of their own, so a read
        # does not queue behind the exchanges (made on first use: most workers never need it).
        self.history_db: Reconnecting | None = None
        self.history_thread = ThreadPoolExecutor(1, thread_name_prefix="qforge-history")
        self.task_threads = ThreadPoolExecutor(concurrency, thread_name_prefix="qforge-task")
        self.running: dict[UUID, Running] = {}
        self.free_slots = list(range(concurrency - 1, -1, -1))  # pop() hands out slot 0 first
        self.completions: list[Report] = []
        self.failures: list[Report] = []
        self.claim_wanted = True
        self.retry_due: float | None = None  # monotonic time when a job this worker failed is due again
        self.timers: list[float] = []  # heap: monotonic times when pending jobs of our queues come due
        self.stopping = False
        self.grace_deadline = float("inf")
        self.stats = Stats()
        self.failure_log = reporting.FailureLog()
        self.wake: asyncio.Event | None = None  # set by anything the loop should react to
        self.signalled: asyncio.Event | None = None  # set by SIGTERM/SIGINT

    # --- the loop -------------------------------------------------------------

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT; 0 after a clean stop, 1 if the last reports could not be written."""
        loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
        self.signalled = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)
        listener = asyncio.create_task(self._listen())
        try:
            if not await self._register():
                return 0  # told to stop before the database was ever reachable
            log.info("worker %s started: queues %s, concurrency %d", self.name, ",".join(self.queues),
                     self.concurrency)
            if self.task_policy.isolation is not None:
                log.info("%s%s", self.task_policy.isolation.describe(),
                         "; the worker is not dumpable" if self.undumpable else "")
            if self.settings.heartbeat_seconds * 1.5 >= self.settings.stale_seconds:
                # A job can go 1.5 intervals without a beat (young jobs skip one).
                log.warning("QFORGE_HEARTBEAT_SECONDS (%g) is too close to QFORGE_STALE_SECONDS (%g):"
                            " the monitor may recover jobs that are still running",
                            self.settings.heartbeat_seconds, self.settings.stale_seconds)
            await self._serve()
            return await self._shutdown()
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            await loop.run_in_executor(self.db_thread, self.db.close)
            self.db_thread.shutdown()
            if self.history_db is not None:
                await loop.run_in_executor(self.history_thread, self.history_db.close)
            self.history_thread.shutdown()

    async def _serve(self) -> None:
        heartbeat = self.settings.heartbeat_seconds
        poll = self.settings.poll_interval_seconds
        next_beat = time.monotonic() + heartbeat
        next_poll = time.monotonic() + poll
        backoff = Backoff()
        outage_since: float | None = None
        while True:
            now = time.monotonic()
            if self.stopping and (not self.running or now >= self.grace_deadline):
                return
            try:
                if now >= next_beat:
                    next_beat = now + heartbeat
                    await self._beat()
                if self.retry_due is not None:
                    next_poll, self.retry_due = min(next_poll, self.retry_due), None
                if now >= next_poll:
                    next_poll = now + poll
                    self.claim_wanted = True
                while self.timers and self.timers[0] <= now:
                    heapq.heappop(self.timers)
                    self.claim_wanted = True
                claim_limit = len(self.free_slots) if self.claim_wanted and not self.stopping else 0
                if self.completions or self.failures or claim_limit:
                    await self._exchange(claim_limit)
            except TRANSIENT_ERRORS as exc:
                if outage_since is None:
                    outage_since = now
                    log.warning("database unavailable (%s); %d jobs running, %d results buffered; retrying",
                                describe(exc), len(self.running), len(self.completions) + len(self.failures))
                await self._pause(backoff.next_delay())
                continue
            except psycopg.Error:
                # A bug or a schema problem, not an outage. Crashing would only
                # orphan the running jobs until the monitor recovers them.
                log.exception("unexpected database error; retrying")
                await self._pause(backoff.next_delay())
                continue
            backoff.reset()
            if outage_since is not None:
                log.info("database back after %.1fs", time.monotonic() - outage_since)
                outage_since = None
            self.wake.clear()
            if (self.completions or self.failures
                    or (self.claim_wanted and self.free_slots and not self.stopping)
                    or (self.stopping and not self.running)):
                continue
            deadline = min(next_beat, next_poll, self.grace_deadline,
                           self.retry_due if self.retry_due is not None else float("inf"),
                           self.timers[0] if self.timers else float("inf"))
            await self._sleep(deadline - time.monotonic())

    async def _sleep(self, seconds: float) -> None:
        """Until woken (a job finished, a notification, a signal) or `seconds` passed."""
        if seconds <= 0:
            return
        try:
            async with asyncio.timeout(seconds):
                await self.wake.wait()
        except TimeoutError:
            pass

    async def _pause(self, seconds: float) -> None:
        """Back off for `seconds`; unlike _sleep, only a new signal cuts it short (finishing jobs do not)."""
        try:
            async with asyncio.timeout(seconds):
                await self.signalled.wait()
            self.signalled.clear()
        except TimeoutError:
            pass

    def _on_signal(self, signum: int) -> None:
        if not self.stopping:
            self.stopping = True
            self.grace_deadline = time.monotonic() + self.settings.shutdown_grace_seconds
            log.info("%s: stopping; waiting up to %gs for %d running jobs (signal again to hand them back now)",
                     signal.Signals(signum).name, self.settings.shutdown_grace_seconds, len(self.running))
        else:
            self.grace_deadline = time.monotonic()
            log.info("%s again: handing back %d running jobs now", signal.Signals(signum).name, len(self.running))
        self.signalled.set()
        self.wake.set()

    def _want_claim(self) -> None:
        self.claim_wanted = True
        self.wake.set()

    def _due_at(self, epoch: float) -> None:
        """Claim when a job due at `epoch` (seconds, the database's clock, which is this host's
        or close to it) comes due: a timer in the loop, which recomputes its sleep on waking."""
        # A millisecond late, so that the claim's now() is past the job's run_at.
        heapq.heappush(self.timers, time.monotonic() + (epoch - time.time()) + 0.001)
        if len(self.timers) > MAX_TIMERS:
            self.timers = heapq.nsmallest(MAX_TIMERS // 2, self.timers)
        self.wake.set()

    async def _db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(conn, ...)` on the database thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.db_thread, functools.partial(self.db.run, fn, *args, **kwargs))

    # --- claiming and running -------------------------------------------------

    def _start(self, job: ClaimedJob) -> None:
        run = Running(job=job, slot=self.free_slots.pop(), started_at=datetime.now(timezone.utc),
                      beat_at=time.monotonic())
        self.running[job.id] = run
        run.task = asyncio.create_task(self._run_job(run))

    async def _run_job(self, run: Running) -> None:
        job = run.job
        ok = False
        try:
            with tracing.run_span(job):
                result = await self._execute(job)
            outcome: Report | None = reporting.succeeded(job, result)
            ok = True
        except asyncio.CancelledError:
            outcome = None  # stopped by this worker (cancelled, superseded or shutdown): nothing to report
        except Exception as exc:
            outcome = reporting.failed(job, exc)
        del self.running[job.id]
        self.free_slots.append(run.slot)
        if outcome is not None and not run.abandoned:
            (self.completions if ok else self.failures).append(outcome)
            if job.workflow_id is not None:
                # what the report unblocks (the next step, the next run of a code workflow's
                # function) is claimable in the report's own transaction: claim with it
                self.claim_wanted = True
        self.wake.set()

    async def _execute(self, job: ClaimedJob) -> Any:
        if job.task == code_journal.TASK and job.workflow_id is not None:
            # a code workflow's function (qforge.workflows): replayed against the rows of its workflow
            workflow, rows = await self._read_history(job.workflow_id)
            return await activation.activate(workflow, rows, thread_pool=self.task_threads)
        ctx = TaskContext(job_id=job.id, attempt=job.attempt, task=job.task, queue=job.queue,
                          workflow_id=job.workflow_id, step=job.step, timeout_seconds=job.timeout_seconds,
                          allow_shell=self.allow_shell, policy=self.task_policy)
        if job.timeout_seconds is None:
            return await execute(job.task, job.payload, ctx, thread_pool=self.task_threads)
        scope = asyncio.timeout(job.timeout_seconds)
        try:
            async with scope:
                return await execute(job.task, job.payload, ctx, thread_pool=self.task_threads)
        except TimeoutError:
            if scope.expired():
                message = f"job timed out after {job.timeout_seconds:g}s (timeout_seconds)"
                raise reporting.JobTimedOut(message) from None
            raise

    async def _read_history(self, workflow_id: UUID) -> tuple[dict, list[dict]]:
        if self.history_db is None:
            self.history_db = Reconnecting(self.url, f"qforge-worker {self.name} history")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.history_thread, functools.partial(
            self.history_db.run, durable.read_history, workflow_id))

    def _abandon(self, run: Running) -> None:
        run.abandoned = True
        if run.task is not None:
            run.task.cancel()  # shell: executors kill the whole process group before it ends

    # --- reporting --------------------------------------------------------------

    async def _exchange(self, claim_limit: int = 0) -> None:
        """Write the buffered results and claim up to `claim_limit` new jobs, in one transaction."""
        completions, failures = self.completions, self.failures
        self.completions, self.failures = [], []
        # Cleared before the round trip: a notification that lands meanwhile sets it again.
        self.claim_wanted = self.claim_wanted and not claim_limit
        try:
            done, failed, written, jobs = await self._db(self._exchange_sync, completions, failures, claim_limit)
        except BaseException:
            # Kept for the next turn. If the lost round trip had committed, the
            # retry is rejected by the (job_id, attempt) fence and changes nothing.
            self.completions[:0] = completions
            self.failures[:0] = failures
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
        if jobs:
            log.debug("claimed %d jobs", len(jobs))
        for job in jobs:
            self._start(job)

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
                 "started_at": run.started_at.isoformat(), "slot": run.slot}
                for run in self.running.values() if not run.abandoned]

    # --- start and stop -----------------------------------------------------------

    async def _register(self) -> bool:
        """Write the registry row, waiting for the database if need be; False if stopped meanwhile."""
        backoff = Backoff()
        warned = False
        while not self.stopping:
            try:
                await self._db(workers.record, self.info, [])
                return True
            except TRANSIENT_ERRORS as exc:
                if not warned:
                    log.warning("waiting for the database (%s)", describe(exc))
                    warned = True
                await self._pause(backoff.next_delay())
        return False

    async def _shutdown(self) -> int:
        """Stop what still runs, hand it back (Released), write the last results, leave the registry."""
        left = list(self.running.values())
        for run in left:
            self._abandon(run)
        if left:
            tasks = [run.task for run in left if run.task is not None]
            _, pending = await asyncio.wait(tasks, timeout=TASK_STOP_WAIT_SECONDS)
            if pending:
                log.warning("%d tasks did not stop within %gs", len(pending), TASK_STOP_WAIT_SECONDS)
        releases = [Report(run.job.id, run.job.attempt, workflow_id=run.job.workflow_id) for run in left]
        backoff = Backoff()
        give_up = time.monotonic() + FINAL_REPORT_RETRY_SECONDS
        while True:
            try:
                if self.completions or self.failures:
                    await self._exchange()
                if releases:
                    outcome = await self._db(workers.release, releases, actor=self.name, reason="shutdown")
                    log.info("handed back %d unfinished jobs (Released)%s", len(outcome.accepted),
                             f"; {len(outcome.rejected)} had been cancelled or taken over" if outcome.rejected
                             else "")
                    releases = []
                await self._db(workers.stop, self.name)
                break
            except TRANSIENT_ERRORS as exc:
                if time.monotonic() >= give_up:
                    log.error("stopping without writing %d results and %d hand-backs: database unavailable"
                              " (%s); the monitor will recover those jobs as stale",
                              len(self.completions) + len(self.failures), len(releases), describe(exc))
                    return 1
                await asyncio.sleep(backoff.next_delay())
            except psycopg.Error:
                log.exception("stopping without writing the last reports; the monitor will recover those jobs")
                return 1
        self.failure_log.flush(force=True)
        log.info("worker %s stopped", self.name)
        return 0

    async def _listen(self) -> None:
        """Wake the loop when jobs become pending in our queues (LISTEN on a connection of its own)."""
        backoff = Backoff()
        while True:
            try:
                conn = await connect_async(self.url, f"qforge-worker {self.name} listen")
                try:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(JOBS_CHANNEL)))
                    backoff.reset()
                    self._want_claim()  # whatever was notified while nobody listened
                    due = await (await conn.execute(q("job_next_due"), {"queues": self.queues})).fetchone()
                    if due and due[0] is not None:
                        self._due_at(due[0])
                    async for note in conn.notifies():
                        # "queue" (due now) or "queue epoch" (the earliest due then)
                        queue, _, epoch = note.payload.partition(" ")
                        if queue in self.queue_set:
                            if epoch:
                                self._due_at(float(epoch))
                            else:
                                self._want_claim()
                finally:
                    await conn.close()
            except TRANSIENT_ERRORS as exc:
                log.debug("listener connection lost (%s); polling until it is back", describe(exc))
                await asyncio.sleep(backoff.next_delay())
            except Exception as exc:  # never fatal: polling still finds the work, only later
                log.warning("listener failed (%s); polling until it is back", describe(exc))
                await asyncio.sleep(backoff.next_delay())


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"
