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

The class is in three modules: this one (the loop, running jobs, start and
stop), `qforge.workers.wakeups` (LISTEN, timers, signals, sleeps) and
`qforge.workers.exchange` (writing results, claiming, heartbeats).
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
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, TypeVar
from uuid import UUID

import psycopg

from qforge import tracing
from qforge.commands import workers
from qforge.commands.claim import ClaimedJob, plan_generically
from qforge.commands.report import Report
from qforge.db import behind_pooler
from qforge.settings import Settings, get_settings
from qforge.workers.sandbox import TaskPolicy
from qforge.workers import reporting
from qforge.workers.connection import TRANSIENT_ERRORS, Backoff, Reconnecting, describe
from qforge.workers.exchange import Exchanges, Stats
from qforge.workers.executors import execute
from qforge.workers.host import make_undumpable
from qforge.workers.tasks import TaskContext, registered_task_names
from qforge.workers.wakeups import Wakeups
from qforge.workflows import activation, durable, inline
from qforge.workflows import journal as code_journal

log = logging.getLogger("qforge.worker")

T = TypeVar("T")

# How long a stopping worker keeps retrying its last reports while the database is away.
FINAL_REPORT_RETRY_SECONDS = 30.0
# Reports of workflow steps wait up to this long for steps claimed with them that still run (_linger).
LINGER_SECONDS = 0.01
# Cancelled tasks get this long to clean up (a shell command's group gets SIGTERM, then SIGKILL after 2 s).
TASK_STOP_WAIT_SECONDS = 5.0


@dataclass(eq=False, slots=True)
class Running:
    """A job in a slot."""

    job: ClaimedJob
    slot: int
    started_at: float  # time.time(): a datetime only for the registry's snapshot (a heartbeat's)
    beat_at: float  # monotonic time of the last recorded Claimed/Heartbeat
    task: asyncio.Task | None = None
    abandoned: bool = False  # stopped by the worker: whatever it returns is not reported


class Worker(Wakeups, Exchanges):
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
        self.undumpable = allow_shell and make_undumpable()
        self.info = workers.WorkerInfo(name=name, host=socket.gethostname(), pid=os.getpid(),
                                       queues=queues, concurrency=concurrency,
                                       started_at=datetime.now(timezone.utc),
                                       tasks=tuple(sorted({*registered_task_names(), "http",
                                                           *(["shell"] if allow_shell else [])})))
        # A session-wide plan setting would stay on a server connection a transaction pooler shares.
        self.db = Reconnecting(url, f"qforge-worker {name}",
                               setup=None if behind_pooler(self.settings) else plan_generically)
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
        # This worker's own wake channel (34_wake.sql), named by its listening connection's pid while
        # that connection LISTENs; `waiting`: a job_waiters row of it is there, not yet taken.
        self.wake_channel: str | None = None
        self.wake_pid: int | None = None  # the backend pid of that connection
        self.lost_channel: str | None = None  # that of a listening connection lost since
        self.waiting = False
        self.passing: set[asyncio.Task] = set()  # wake-ups passed on, handed jobs taken (wakeups.py)
        self.beat_soon = False  # heartbeat at the next turn, not when the interval is up
        self.signalled: asyncio.Event | None = None  # set by SIGTERM/SIGINT
        # The running loop, for _start (asyncio.get_running_loop() costs a getpid() system call per job)
        self.loop: asyncio.AbstractEventLoop | None = None

    # --- the loop -------------------------------------------------------------

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT; 0 after a clean stop, 1 if the last reports could not be written."""
        loop = self.loop = asyncio.get_running_loop()
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
            self.loop = None

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
                if now >= next_beat or self.beat_soon:
                    next_beat, self.beat_soon = now + heartbeat, False
                    await self._beat()
                if self.retry_due is not None:
                    next_poll, self.retry_due = min(next_poll, self.retry_due), None
                if now >= next_poll:
                    next_poll = now + poll
                    self.claim_wanted = True
                while self.timers and self.timers[0] <= now:
                    heapq.heappop(self.timers)
                    self.claim_wanted = True
                if not self.stopping and (linger := self._linger(time.monotonic())) is not None:
                    self.wake.clear()
                    if self._linger(time.monotonic()) is not None:  # none finished between the look and the clear
                        await self._sleep(linger - time.monotonic())
                    continue
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

    def _linger(self, now: float) -> float | None:
        """When to write the buffered reports of workflow steps if not at once: while steps of
        workflows started less than LINGER_SECONDS ago still run (the monotonic time the oldest
        of them gets that old), else None. Short steps claimed together then report together:
        otherwise the reports of those that finish first go in one round trip and the rest wait
        for it, the two halves taking turns, each step waiting for two round trips (one of them
        the other half's) before its workflow's next step can start."""
        if not self.completions or self.failures or any(r.workflow_id is None for r in self.completions):
            return None
        young = [run.beat_at for run in self.running.values()
                 if run.job.workflow_id is not None and not run.abandoned and now - run.beat_at < LINGER_SECONDS]
        return min(young) + LINGER_SECONDS if young else None

    async def _db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(conn, ...)` on the database thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.db_thread, functools.partial(self.db.run, fn, *args, **kwargs))

    # --- claiming and running -------------------------------------------------

    def _start(self, job: ClaimedJob, slot: int | None = None) -> None:
        """Run `job` in `slot` (one the caller has taken), else in a free one."""
        run = Running(job, self.free_slots.pop() if slot is None else slot, time.time(), time.monotonic())
        self.running[job.id] = run
        run.task = (self.loop or asyncio.get_running_loop()).create_task(self._run_job(run))

    async def _run_job(self, run: Running) -> None:
        job = run.job
        ok = False
        try:
            with tracing.run_span(job):
                result = await self._execution(job)
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

    def _execution(self, job: ClaimedJob) -> Awaitable[Any]:
        """What running `job` awaits. A plain function, so that a job without a timeout awaits
        execute() itself, not a coroutine of this method around it (one frame less per job)."""
        if job.task == code_journal.TASK and job.workflow_id is not None:
            return self._activate(job)
        ctx = self._context(job)
        if job.timeout_seconds is None:
            return execute(job.task, job.payload, ctx, thread_pool=self.task_threads)
        return self._execute_timed(job, ctx)

    def _context(self, job: ClaimedJob) -> TaskContext:
        """TaskContext(...) for `job`, made without the frozen dataclass's __init__, which sets each
        field through object.__setattr__ (2.5 µs a job; filling the instance's dict: 0.8)."""
        ctx = object.__new__(TaskContext)
        fields = ctx.__dict__
        fields["job_id"], fields["attempt"], fields["task"], fields["queue"] = job.id, job.attempt, job.task, job.queue
        fields["workflow_id"], fields["step"], fields["timeout_seconds"] = job.workflow_id, job.step, job.timeout_seconds
        fields["allow_shell"], fields["policy"] = self.allow_shell, self.task_policy
        return ctx

    async def _activate(self, job: ClaimedJob) -> Any:
        """A code workflow's function (qforge.workflows): replayed against the rows of its workflow,
        or already running since the report that enqueued this run (inline.adopt)."""
        adopted = inline.adopt(job.id)
        if adopted is not None and (result := await asyncio.wrap_future(adopted)) is not None:
            return result
        workflow, rows = await self._read_history(job.workflow_id)
        return await activation.activate(workflow, rows, thread_pool=self.task_threads)

    async def _execute_timed(self, job: ClaimedJob, ctx: TaskContext) -> Any:
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
                await self._stop_waiting()
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


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"
