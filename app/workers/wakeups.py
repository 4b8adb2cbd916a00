"""How the worker's loop is woken: LISTEN for pending jobs, timers on jobs due later, signals, sleeps.

`Wakeups` is mixed into `qforge.workers.worker.Worker` and works on its state
(`wake`, `signalled`, `claim_wanted`, `timers`, `stopping`, ...): whatever should
make the loop look again sets `wake`; the loop (`Worker._serve`) sleeps on it.

A worker whose claim came up short waits on a channel of its own as well
(34_wake.sql): a new job then wakes the one worker that has waited longest,
not every worker, so no other claims it in vain.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import signal
import time
from uuid import UUID

import psycopg
from psycopg import sql

from qforge.commands import claim, workers
from qforge.commands.report import Report
from qforge.db import direct_url, say_polling
from qforge.events.store import JOBS_CHANNEL
from qforge.sql import q
from qforge.workers.connection import TRANSIENT_ERRORS, Backoff, connect_async, describe

log = logging.getLogger("qforge.worker")

# Due times of delayed jobs kept for timers (the earliest ones; the poll finds any beyond).
MAX_TIMERS = 1000


class Wakeups:
    """The worker's wake-ups: its LISTEN connection, its timers, its signal handler and its sleeps."""

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

    async def _wait_for_work(self) -> None:
        """After a short claim: be the worker the next job wakes. A job made due before the row
        is in woke every worker (jobs_wake finds no row to take)."""
        channel = self.wake_channel
        if channel is None or self.waiting or self.stopping or not self.free_slots:
            return
        self.waiting = True
        try:
            await self._db(_execute, q("worker_wait"), {"channel": channel, "queues": self.queues,
                                                        "slots": len(self.free_slots), "worker": self.name,
                                                        "pid": self.wake_pid})
        except BaseException:
            self.waiting = False
            raise

    async def _stop_waiting(self) -> None:
        for channel in {self.wake_channel, self.lost_channel} - {None}:
            await self._db(_execute, q("worker_wait_end"), {"channel": channel})

    def _woken(self, queue: str) -> None:
        """Our own channel named us (the row was taken): claim, or, without a free slot, pass the
        wake-up on to every worker."""
        self.waiting = False
        if self.free_slots and not self.stopping:
            self._want_claim()
            return
        self._spawn(self._pass_on(queue))

    def _handed(self, payload: str) -> None:
        """Our own channel brought jobs claimed for us by the statement that created them (jobs_hand,
        34_wake.sql): start them now, without a claim of our own."""
        self.waiting = False
        items = json.loads(payload)
        jobs = [claim.handed(item) for item in items if "task" in item]
        by_id = [UUID(item["id"]) for item in items if "task" not in item]
        # claimed long before we heard (the enqueue's transaction was slow to commit): beat at once,
        # before the monitor takes the Claimed event's time for the last sign of life
        late = min(item["at"] for item in items) < time.time() - self.settings.heartbeat_seconds / 2
        log.debug("took %d handed jobs", len(items))
        rest = [job for job in jobs if not self._start_handed(job, late)]
        self._spawn(self._after_handed(by_id, rest, late))

    def _start_handed(self, job: claim.ClaimedJob, late: bool) -> bool:
        if not self.free_slots or self.stopping:
            return False
        self._start(job)
        if late:
            self.running[job.id].beat_at = float("-inf")
            self.beat_soon = True
            self.wake.set()
        return True

    async def _after_handed(self, by_id: list[UUID], rest: list[claim.ClaimedJob], late: bool) -> None:
        """Fetch the jobs named by id only, hand back what there is no slot for, and wait again."""
        try:
            if by_id:
                fetched = await self._db(claim.handed_by_id, by_id, self.name)
                rest += [job for job in fetched if not self._start_handed(job, late)]
            if rest:
                reports = [Report(job.id, job.attempt) for job in rest]
                await self._db(workers.release, reports, actor=self.name, reason="no free slot")
                log.info("handed back %d jobs handed to this worker without a free slot", len(rest))
            await self._wait_for_work()
        except Exception as exc:  # the monitor recovers what could not be started or handed back
            log.warning("could not take the jobs handed to this worker (%s)", describe(exc))

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.passing.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self.passing.discard)

    async def _pass_on(self, queue: str) -> None:
        try:
            await self._db(_execute, q("queue_wake"), {"queue": queue})
        except Exception as exc:  # the poll finds the job, only later
            log.debug("could not pass a wake-up on (%s)", describe(exc))

    async def _listen(self) -> None:
        """Wake the loop when jobs become pending in our queues (LISTEN on a connection of its own)."""
        url = direct_url(self.url, self.settings)  # behind a transaction pooler: QFORGE_LISTEN_DATABASE_URL
        if url is None:  # none: _serve's poll every QFORGE_POLL_INTERVAL_SECONDS finds the work
            say_polling(f"worker {self.name}", self.settings.poll_interval_seconds)
            return
        backoff = Backoff()
        while True:
            try:
                conn = await connect_async(url, f"qforge-worker {self.name} listen")
                try:
                    channel = f"qforge_wake_{conn.info.backend_pid}"
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(JOBS_CHANNEL)))
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    if self.lost_channel is not None:  # a row of the connection before is nobody's
                        await conn.execute(q("worker_wait_end"), {"channel": self.lost_channel})
                        self.lost_channel = None
                    self.wake_channel, self.wake_pid, self.waiting = channel, conn.info.backend_pid, False
                    backoff.reset()
                    self._want_claim()  # whatever was notified while nobody listened
                    due = await (await conn.execute(q("job_next_due"), {"queues": self.queues})).fetchone()
                    if due and due[0] is not None:
                        self._due_at(due[0])
                    async for note in conn.notifies():
                        if note.channel == channel:  # chosen alone: jobs handed to us, or "queue", due now
                            if note.payload.startswith("["):
                                self._handed(note.payload)
                            else:
                                self._woken(note.payload)
                            continue
                        # "queue" (due now) or "queue epoch" (the earliest due then)
                        queue, _, epoch = note.payload.partition(" ")
                        if queue in self.queue_set:
                            if epoch:
                                self._due_at(float(epoch))
                            else:
                                self._want_claim()
                finally:
                    if self.wake_channel is not None:
                        self.lost_channel, self.wake_channel = self.wake_channel, None
                    await conn.close()
            except TRANSIENT_ERRORS as exc:
                log.debug("listener connection lost (%s); polling until it is back", describe(exc))
                await asyncio.sleep(backoff.next_delay())
            except Exception as exc:  # never fatal: polling still finds the work, only later
                log.warning("listener failed (%s); polling until it is back", describe(exc))
                await asyncio.sleep(backoff.next_delay())



def _execute(conn: psycopg.Connection, query: str, params: dict) -> None:
    conn.execute(query, params)
