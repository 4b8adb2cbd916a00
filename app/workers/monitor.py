"""The monitor: one leader at a time recovers stale jobs, fires timers, marks silent workers gone, checkpoints, archives and packs the log.

Leadership is an advisory lock (qforge.workers.leadership: on the monitor's own
connection, or behind a transaction pooler on a connection of its own).
Any number of monitors may run: the others retry the lock every tick, and when
the leader dies its connection closes, the lock frees and one of them takes
over. Without a pooler the leader does its work on that same connection, so if
the connection breaks it stops acting at once (its lock is gone too) and
competes again; behind one it checks its lock's connection before each tick.
Archiving and packing closed partitions of the log (qforge.log.archive,
.pack) take minutes for a big partition: the leader runs them on a thread and a
connection of its own (LogKeeper), so the tick's duties never wait for them.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

import psycopg
from psycopg.rows import tuple_row

from qforge.commands import workers
from qforge.commands.manage import recover_stale
from qforge.log.archive import archive
from qforge.log.pack import pack
from qforge.commands.schedules import fire_due, next_due
from qforge.workflows.engine import finish_parents, fire_deadlines, fire_timers
from qforge.audit import checkpoints as audit
from qforge.audit import witness
from qforge.projections import serving
from qforge.projections.stats import queue_stats
from qforge.settings import Settings, get_settings
from qforge.warn_once import OncePerInterval
from qforge.sql import q
from qforge.db import direct_url
from qforge.workers.connection import TRANSIENT_ERRORS, Backoff, close_quietly, connect, describe
from qforge.workers.leadership import Leadership

log = logging.getLogger("qforge.monitor")
UNSERVED_CHECK_SECONDS = 5.0  # how often the leader looks for due jobs no live worker takes
BATCH_LIMIT = 100  # stale jobs or timers per transaction; a tick repeats until fewer come back
SLEEP_SLICE_SECONDS = 0.05  # how quickly a sleeping monitor notices a signal


class Monitor:
    def __init__(self, url: str, *, name: str, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.url = url
        self.name = name
        self.actor = f"monitor:{name}"
        self.stopping = False
        self.judge_after = float("-inf")  # no stale-job recovery or worker sweep before this (monotonic)
        self.checkpoint_after = float("-inf")  # next audit checkpoint (monotonic)
        self.witnessed = False  # a head was written to the witness directory since this start
        self.look_for_unserved_at = float("-inf")  # next look for due jobs no worker takes (monotonic)
        self.unserved = OncePerInterval(log)
        self.keeper: LogKeeper | None = None
        self.lead = Leadership(url, name, self.settings)

    def stop(self, *_: object) -> None:
        """Signal-safe: only sets a flag that the loop checks."""
        self.stopping = True

    def run(self) -> int:
        tick = self.settings.monitor_tick_seconds
        backoff = Backoff()
        # The lock belongs to this connection's session: a new connection
        # never inherits leadership, it has to win the lock again.
        conn: psycopg.Connection | None = None
        leader = waiting_logged = False
        outage_since: float | None = None
        try:
            while not self.stopping:
                try:
                    if conn is None:
                        conn = connect(self.url, f"qforge-monitor {self.name}")
                        leader = False
                        if outage_since is not None:
                            # Workers lost the database too and could not
                            # heartbeat: judge staleness only once they had
                            # a full stale period to reconnect and beat again.
                            self.judge_after = time.monotonic() + self.settings.stale_seconds
                            log.info("database back after %.1fs; recovering stale jobs again in %gs",
                                     time.monotonic() - outage_since, self.settings.stale_seconds)
                            outage_since = None
                    if not (leader and self.lead.holds()):
                        leader, waiting_logged = self._compete(conn, leader, waiting_logged)
                    pause = tick
                    if leader:
                        self.tick(conn)
                        pause = self._until_next_schedule(conn, tick)
                    backoff.reset()
                    self._sleep(pause)
                except TRANSIENT_ERRORS as exc:
                    if conn is None or conn.closed or conn.broken:
                        if outage_since is None:
                            outage_since = time.monotonic()
                            log.warning("database unavailable (%s)%s; reconnecting", describe(exc),
                                        ": no longer leading" if leader else "")
                        close_quietly(conn)
                        self.lead.release()
                        conn, leader = None, False
                    else:  # a deadlock or a cancelled statement: the session (and its lock) survive
                        log.warning("tick failed (%s); retrying", describe(exc))
                    self._sleep(backoff.next_delay())
                except psycopg.Error:
                    log.exception("unexpected database error; retrying")
                    self._sleep(max(tick, backoff.next_delay()))
        finally:
            close_quietly(conn)  # frees the lock now rather than when the server notices
            self.lead.release()
            if self.keeper is not None:
                self.keeper.stop()
        log.info("monitor %s stopped", self.name)
        return 0

    def _compete(self, conn: psycopg.Connection, was_leader: bool, waiting_logged: bool) -> tuple[bool, bool]:
        """Try to lead (again, if `was_leader` and the lock was lost): (leading now, "waiting" said)."""
        if was_leader:
            log.warning("monitor %s no longer leads", self.name)
        if self.lead.take(conn):
            log.info("monitor %s is the leader", self.name)
            self._start_keeper()
            return True, False
        if not waiting_logged:
            log.info("monitor %s is waiting: another monitor leads", self.name)
        return False, True

    def _start_keeper(self) -> None:
        """The leader keeps the log: closes, archives and packs partitions (once started it goes
        on even if leadership passes: archive and pack take turns through their own lock)."""
        if self.keeper is None and LogKeeper.wanted(self.settings):
            # Archive and pack hold a session lock across many transactions: behind a transaction
            # pooler they need the direct connection.
            url = direct_url(self.url, self.settings)
            if url is None:
                log.warning("QFORGE_POOLER=transaction without QFORGE_LISTEN_DATABASE_URL: the monitor does not"
                            " pack, archive or close partitions of the log (their lock needs a direct connection)")
                return
            self.keeper = LogKeeper(url, self.settings)
            self.keeper.start()

    def _until_next_schedule(self, conn: psycopg.Connection, tick: float) -> float:
        """Sleep a tick, or less when a schedule's next tick comes sooner (a tick a second fires on time)."""
        due = next_due(conn)
        if due is None:
            return tick
        left = (due - datetime.now(timezone.utc)).total_seconds()
        # Already due after a round: one that cannot fire (logged), or one that came
        # during the round. Not a busy loop either way.
        return min(tick, SLEEP_SLICE_SECONDS * 4) if left <= 0 else min(tick, left)

    def tick(self, conn: psycopg.Connection) -> None:
        """One round of the leader's duties."""
        stale = self.settings.stale_seconds
        ticks = fire_due(conn, actor=self.actor, grace_seconds=self.settings.schedule_misfire_seconds)
        if ticks:
            log.info("fired %d schedule tick(s)", ticks)
        with conn.cursor(row_factory=tuple_row) as cur:
            made = cur.execute(q("log_maintain")).fetchone()[0]
            if made:
                log.info("created %d log partition(s) ahead of the appends", made)
            cur.execute(q("counters_compact"))
            cur.execute(q("concurrency_compact"))
        try:
            self._checkpoint(conn)
        except TRANSIENT_ERRORS:
            raise
        except psycopg.Error:  # the audit must not stop the timers and the recovery below
            log.exception("audit checkpoint failed; trying again next tick")
        fired = sum(_drain_counts(lambda: fire_timers(conn, limit=BATCH_LIMIT, actor=self.actor)))
        if fired:
            log.info("fired %d timers (sleep steps ended, trigger waits timed out)", fired)
        late = sum(_drain_counts(lambda: fire_deadlines(conn, limit=BATCH_LIMIT, actor=self.actor)))
        if late:
            log.info("failed %d workflows past their deadline", late)
        ended = sum(_drain_counts(lambda: finish_parents(conn, limit=BATCH_LIMIT, actor=self.actor)))
        if ended:
            log.info("ended %d workflow steps whose sub-workflow ended", ended)
        if time.monotonic() < self.judge_after:
            return
        recovered = _drain(lambda: recover_stale(conn, stale_seconds=stale, limit=BATCH_LIMIT, actor=self.actor))
        if recovered:
            log.info("recovered %d stale jobs (no heartbeat for %gs): %s", len(recovered), stale,
                     _ids(recovered))
        gone = workers.mark_gone(conn, stale_seconds=stale)
        if gone:
            log.info("workers gone (silent for over %gs): %s", stale, ", ".join(gone))
        if time.monotonic() >= self.look_for_unserved_at:
            self.look_for_unserved_at = time.monotonic() + UNSERVED_CHECK_SECONDS
            self._warn_unserved(conn)

    def _warn_unserved(self, conn: psycopg.Connection) -> None:
        """Say (once a minute per queue and task) when due jobs wait for a worker that is not there."""
        for warnings in serving.unserved(conn, queue_stats(conn), self.settings.stale_seconds).values():
            for subject, text in warnings:
                self.unserved.warn(subject, text)

    def _checkpoint(self, conn: psycopg.Connection) -> None:
        """An audit checkpoint every QFORGE_AUDIT_CHECKPOINT_SECONDS (0: none)."""
        every = self.settings.audit_checkpoint_seconds
        if not every or time.monotonic() < self.checkpoint_after:
            return
        # One checkpoint a tick: a long backlog (the first checkpoint of a large
        # upgraded log) is caught up tick by tick, between the other duties.
        made = audit.checkpoint(conn, max_checkpoints=1)
        behind = bool(made) and made[-1].events == audit.CHECKPOINT_MAX_EVENTS
        self.checkpoint_after = time.monotonic() + (0 if behind else every)
        if made:
            log.debug("audit checkpoint %d covers %d new events", made[-1].seq, made[-1].events)
        if self.settings.audit_witness_dir and (made or not self.witnessed):
            self._witness(conn)

    def _witness(self, conn: psycopg.Connection) -> None:
        """Each new head into QFORGE_AUDIT_WITNESS_DIR (what a failed write missed, next time)."""
        directory = Path(self.settings.audit_witness_dir)
        key = self.settings.audit_signing_key
        if not key and not self.witnessed:
            log.warning("QFORGE_AUDIT_WITNESS_DIR is set without QFORGE_AUDIT_SIGNING_KEY: the heads"
                        " written to %s are not signed", directory)
        try:
            written = witness.witness(conn, directory, signing_key=key)
        except OSError as exc:
            log.warning("writing audit heads to %s failed (%s); trying again next checkpoint", directory, exc)
            return
        self.witnessed = True
        for path in written:
            log.debug("audit head witnessed: %s", path)

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, SLEEP_SLICE_SECONDS))


class LogKeeper(threading.Thread):
    """The leader's keeping of the log, on a thread and a connection of its own, a round every
    QFORGE_LOG_PACK_SECONDS (60 when packing is off): closes the partition being written once its
    oldest event is QFORGE_LOG_PARTITION_MAX_AGE old; archives to QFORGE_ARCHIVE_DIR the closed
    partitions whose newest event is older than QFORGE_ARCHIVE_AFTER; packs the closed partitions
    that end QFORGE_LOG_PACK_KEEP positions or more before the head. Archive and pack work at most
    QFORGE_LOG_PACK_DUTY of the time (QFORGE_LOG_PACK_BUSY_DUTY while the queue is busy) and skip a
    round while `qforge archive` or `qforge pack` by hand is at work. Stopped between two windows of
    a pack (the next round goes on from it); an archive stopped anywhere is taken up again."""

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(name="qforge-log-keeper", daemon=True)
        self.url, self.settings = url, settings
        self.every = settings.log_pack_seconds or 60.0
        self.stopping = threading.Event()

    @staticmethod
    def wanted(settings: Settings) -> bool:
        return bool(settings.log_pack_seconds > 0 or settings.log_partition_max_age
                    or (settings.archive_after and settings.archive_dir))

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)

    def run(self) -> None:
        while not self.stopping.wait(self.every):
            try:
                with connect(self.url, "qforge-monitor log keeper") as conn:
                    self.round(conn)
            except psycopg.OperationalError as exc:
                log.warning("keeping the log failed (%s); trying again in %gs", describe(exc), self.every)
            except (psycopg.Error, OSError, ValueError):
                log.exception("keeping the log failed; trying again in %gs", self.every)

    def round(self, conn: psycopg.Connection) -> None:
        settings = self.settings
        if settings.log_partition_max_age:
            self._close_old_partition(conn, settings.log_partition_max_age)
        if settings.archive_after and settings.archive_dir:
            done = archive(conn, Path(settings.archive_dir), older_than=settings.archive_after,
                           duty=settings.log_pack_duty, busy_duty=settings.log_pack_busy_duty, wait=False,
                           report=lambda line: log.info("archive: %s", line))
            if done.segments:
                log.info("archived %d partition(s) of the log older than %s, %d events, to %s in %.1fs",
                         len(done.segments), settings.archive_after, done.events, settings.archive_dir,
                         done.seconds)
        if settings.log_pack_seconds > 0 and not self.stopping.is_set():
            keep = settings.log_pack_keep
            if conn.execute(q("pack_due"), {"keep": keep}).fetchone()[0]:
                done = pack(conn, duty=settings.log_pack_duty, busy_duty=settings.log_pack_busy_duty,
                            keep=keep, wait=False, stop=self.stopping.is_set,
                            report=lambda line: log.info("pack: %s", line))
                if done.partitions:
                    log.info("packed %d partition(s) of the log, %d events, in %.1fs",
                             len(done.partitions), done.events, done.seconds)

    @staticmethod
    def _close_old_partition(conn: psycopg.Connection, max_age: timedelta) -> None:
        since = conn.execute(q("archive_current_since")).fetchone()[0]
        if since is not None and since < datetime.now(timezone.utc) - max_age:
            boundary = conn.execute(q("archive_close_current")).fetchone()[0]
            log.info("closed the partition being written (its oldest event is older than %s):"
                     " new appends start at position %d", max_age, boundary)


def _drain(batch: Callable[[], list]) -> list:
    """Repeat a limited batch command until it returns a short batch."""
    found: list = []
    while True:
        items = batch()
        found += items
        if len(items) < BATCH_LIMIT:
            return found


def _drain_counts(batch: Callable[[], int]) -> list[int]:
    counts: list[int] = []
    while True:
        counts.append(batch())
        if counts[-1] < BATCH_LIMIT:
            return counts


def _ids(ids: list) -> str:
    shown = ", ".join(str(i) for i in ids[:10])
    return shown + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
