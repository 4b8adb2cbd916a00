"""What qforge archive and qforge pack share: the lock that lets partitions go one at a time,
the partition's name check, the settled horizon, and the Pace that rests between pieces of work."""

from __future__ import annotations

import re
import time
from typing import Callable

from psycopg import sql
from psycopg.rows import tuple_row

from qforge.sql import q


PARTITION_NAME = re.compile(r"^events_[0-9]{19}$")
# Held by qforge archive and qforge pack (app/log/pack.py) while they take
# partitions out of the live log: one at a time.
LET_GO_LOCK = 0x5146_6F72_6765_0010  # ("QForge" + 16, as the other lock keys)

# Busy: the log grew by at least this many events a second (a queue running
# about 30 jobs/s or more; the archive itself appends nothing), over at least
# LOOK_SECONDS: appends come in batches, so a shorter look would flicker.
BUSY_EVENTS_PER_S = 100.0
LOOK_SECONDS = 1.0


class Pace:
    """Rests after each piece of work so that work takes at most a share of the time:
    a piece that took t seconds is followed by t * (1 - share) / share of sleep. The
    share is `duty` while the queue is quiet and `busy_duty` while it is busy: while
    the log, read by `log_position()` at a rest once LOOK_SECONDS have passed since
    the last look, grew by BUSY_EVENTS_PER_S or more in between."""

    def __init__(self, duty: float, busy_duty: float | None = None,
                 log_position: Callable[[], int] | None = None):
        for name, share in (("duty", duty), ("busy duty", busy_duty)):
            if share is not None and not 0 < share <= 1:
                raise ValueError(f"the archive's {name} is a share of the time, in (0, 1]; not {share}")
        self.duty = duty
        self.busy_duty = duty if busy_duty is None else min(busy_duty, duty)
        self.log_position = log_position
        self.since = time.monotonic()
        self.rested = 0.0
        self.busy_rests = self.rests = 0
        self.is_busy = False
        self.seen: tuple[float, int] | None = None
        self.progress: Callable[[int, int | None], None] | None = None  # (positions done, of how many)
        self.done = 0
        self.total: int | None = None
        self.look()

    def moved(self, positions: int) -> None:
        """Work went `positions` further (what a progress display counts)."""
        self.done += positions
        if self.progress is not None and positions:
            self.progress(self.done, self.total)

    def look(self) -> None:
        """Take the log's position as the baseline of the next look (again after the
        archive moved it itself: closing the current partition skips positions)."""
        if self.log_position is not None and self.busy_duty < self.duty:
            self.seen = (time.monotonic(), self.log_position())

    def busy(self) -> bool:
        """Whether the log grew at a busy queue's rate over the last look (kept until the next)."""
        if self.seen is not None:
            (then, before), now = self.seen, time.monotonic()
            if now - then >= LOOK_SECONDS:
                position = self.log_position()
                self.is_busy = (position - before) / (now - then) >= BUSY_EVENTS_PER_S
                self.seen = (now, position)
        return self.is_busy

    def rest(self) -> None:
        worked = time.monotonic() - self.since
        busy = self.busy()
        share = self.busy_duty if busy else self.duty
        self.rests += 1
        self.busy_rests += busy
        if share < 1 and worked > 0:
            pause = worked * (1 - share) / share
            time.sleep(pause)
            self.rested += pause
        self.since = time.monotonic()


def paced(conn, duty: float, busy_duty: float | None) -> Pace:
    """A Pace that tells a busy queue by how far the log on `conn` has come (qforge archive,
    qforge pack)."""
    return Pace(duty, busy_duty,
                lambda: conn.cursor(row_factory=tuple_row).execute(q("archive_log_position")).fetchone()[0])


class ArchiveError(Exception):
    """An archive that cannot go on safely (a segment that does not read back as written)."""


def partition_identifier(partition: str) -> sql.Identifier:
    name = partition.split(".")[-1].strip('"')
    if not PARTITION_NAME.match(name):
        raise ArchiveError(f"{partition} is not a partition of the log")
    return sql.Identifier(name)


def settled_horizon(conn, cur) -> int:
    """The position below which every append has committed or rolled back: a partition
    wholly below it gets no more events."""
    with conn.transaction():
        cur.execute(q("archive_settle_lock"))
        cur.execute(q("archive_settled_position"))
        return cur.fetchone()["horizon"]
