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
import logging
import signal
import time

import psycopg
from psycopg import sql

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
                                                        "slots": len(self.free_slots)})
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
        passing = asyncio.get_running_loop().create_task(self._pass_on(queue))
        self.passing.add(passing)  # the loop keeps only a weak reference
        passing.add_done_callback(self.passing.discard)

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
                    self.wake_channel, self.waiting = channel, False
                    backoff.reset()
                    self._want_claim()  # whatever was notified while nobody listened
                    due = await (await conn.execute(q("job_next_due"), {"queues": self.queues})).fetchone()
                    if due and due[0] is not None:
                        self._due_at(due[0])
                    async for note in conn.notifies():
                        if note.channel == channel:  # chosen alone: "queue", due now
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
