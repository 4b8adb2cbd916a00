"""qforge pack: closed partitions of the log packed into compressed blocks, inside the database.

A live partition keeps each event as a row: about 230 bytes an event with its
indexes, most of it a row's own header, the hash and the ids, which do not
compress. Packed (migration 0019, definitions/52_log_pack.sql), the events of
log_pack_block() (64) consecutive positions are one row of events_packed, every stored column
of every event kept and the block compressed as a whole: about half the bytes.
Readers see the log whole either way (log_stream, log_workflow, log_range,
events_after_page); a packed partition is archived like a live one.

For each closed partition, oldest first:

1. begin: record it in log_packs and make events_packed_<lower> beside the log;
2. fill it FILL_BLOCKS blocks at a time, each window its own short
   transaction (a long one would keep its xid below every later append and
   hold up the gapless readers), resting between windows (the archive's Pace);
   then build its indexes, CONCURRENTLY for the same reason;
3. finish, in one short transaction: attach it to events_packed and drop the
   live partition, so each event is in the log exactly once at every moment.
   Its locks are waited for LOCK_TIMEOUT at most (a waiting ACCESS EXCLUSIVE
   request on events holds up every later append), and it is tried again.

Killed at any point, a pack goes on where log_packs says it stopped; nothing is
lost, since the live partition goes only with the packed one taking its place.
It takes partitions out of the live log like `qforge archive`, so the two take
turns (LET_GO_LOCK).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Callable

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from qforge.log.common import LET_GO_LOCK, Pace, paced, partition_identifier, settled_horizon
from qforge.sql import q

FILL_BLOCKS = 500  # blocks (of log_pack_block() positions) packed per transaction
LOCK_TIMEOUT = "100ms"
FINISH_TRIES = 100
FAULT_ENV = "QFORGE_PACK_FAULT"  # tests: SIGKILL at a step (STEPS)
STEPS = ("begun", "filled", "indexed", "finished")

Report = Callable[[str], None]


class PackError(Exception):
    pass


@dataclass
class Packed:
    """What one run of qforge pack did."""

    partitions: list[int] = field(default_factory=list)  # lower positions of the partitions packed
    events: int = 0
    seconds: float = 0.0
    finish_tries: int = 0
    skipped: bool = False  # the archive (or another pack) was at work: nothing done
    rested: float = 0.0  # of the seconds, resting (Pace)
    busy_rests: int = 0  # rests taken at the busy duty
    stopped: bool = False  # asked to stop before the end (pack(stop=...))


def _fault(step: str) -> None:
    if os.environ.get(FAULT_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def pack(conn, *, close_current: bool = False, duty: float = 1.0, busy_duty: float | None = None,
         keep: int = 0, wait: bool = True, limit: int | None = None, report: Report | None = None,
         stop: Callable[[], bool] | None = None,
         progress: Callable[[int, int | None], None] | None = None) -> Packed:
    """Pack every closed partition of the live log that ends at least `keep` positions before
    the next append's (at most `limit` of them), working at most `duty` of the time and at
    most `busy_duty` (default: duty) while the queue is busy (the archive's Pace). With
    wait=False, do nothing when the archive or another pack is at work. `stop`, when it says
    so between two windows, ends the run there (the next run goes on from it). `conn` must be
    in autocommit mode (each window is its own transaction). `progress(done, total)` hears of
    every window packed, in log positions."""
    if not conn.autocommit:
        raise ValueError("pack needs an autocommit connection (each window is its own transaction)")
    say = report or (lambda _line: None)
    pace = paced(conn, duty, busy_duty)
    pace.progress = progress
    started = time.monotonic()
    done = Packed()
    with conn.cursor(row_factory=dict_row) as cur:
        if wait:
            cur.execute(q("archive_let_go_lock"), {"key": LET_GO_LOCK})
        else:
            cur.execute(q("archive_let_go_try_lock"), {"key": LET_GO_LOCK})
            if not cur.fetchone()["locked"]:
                done.skipped = True
                return done
        try:
            if close_current:
                cur.execute(q("archive_close_current"))
                say(f"closed the current partition: new appends start at position {cur.fetchone()['boundary']}")
            horizon = settled_horizon(conn, cur)
            cur.execute(q("pack_candidates"), {"horizon": horizon, "keep": keep})
            candidates = cur.fetchall()[:limit]
            pace.total = sum(part["upper"] - part["lower"] for part in candidates)
            for part in candidates:
                events = _pack_partition(conn, cur, part["lower"], part["upper"], pace, done, say,
                                         stop or (lambda: False))
                if events is None:
                    done.stopped = True
                    break
                done.partitions.append(part["lower"])
                done.events += events
        finally:
            cur.execute(q("archive_let_go_unlock"), {"key": LET_GO_LOCK})
    done.seconds = time.monotonic() - started
    done.rested, done.busy_rests = pace.rested, pace.busy_rests
    return done


def _pack_partition(conn, cur, lower: int, upper: int, pace: Pace, done: Packed, say: Report,
                    stop: Callable[[], bool]) -> int | None:
    """The events the partition at `lower` held, packed now; None: stopped before the end."""
    cur.execute(q("pack_begin"), {"lower": lower})
    begun = cur.fetchone()
    filled_to, block = begun["filled_to"], begun["block"]
    window = block * FILL_BLOCKS
    _fault("begun")
    partition = partition_identifier(f"events_{lower:019d}")
    cur.execute(sql.SQL(q("pack_partition_extent")).format(partition=partition))
    extent = cur.fetchone()
    last = extent["last_position"] if extent["last_position"] is not None else lower - 1
    # Windows on block boundaries up to the last event, then the (empty) rest at once.
    start = filled_to
    while start <= last:
        up_to = min(lower + (start - lower) // block * block + window, upper)
        cur.execute(q("pack_fill"), {"lower": lower, "up_to": up_to})
        pace.moved(up_to - start)
        start = up_to
        pace.rest()
        if stop():
            return None
    cur.execute(q("pack_fill"), {"lower": lower, "up_to": upper})
    pace.moved(upper - max(start, filled_to))
    _fault("filled")
    cur.execute(q("pack_indexes"), {"lower": lower})
    for statement in [row["statement"] for row in cur.fetchall()]:
        # (made by log_pack_indexes from the catalog: no input of ours; run by a SECURITY
        # DEFINER function, so that the monitor's role may pack, issue 30)
        cur.execute(q("pack_make_index"), {"lower": lower, "statement": statement})
        pace.rest()
    _fault("indexed")
    _finish(conn, cur, lower, extent["events"], done)
    _fault("finished")
    say(f"events_{lower:019d}: {extent['events']:,} events packed")
    return extent["events"]


def _finish(conn, cur, lower: int, events: int, done: Packed) -> None:
    for attempt in range(FINISH_TRIES):
        done.finish_tries += 1
        try:
            with conn.transaction():
                cur.execute(q("pack_lock_timeout"), {"timeout": LOCK_TIMEOUT})
                cur.execute(q("pack_finish"), {"lower": lower, "events": events})
            return
        except psycopg.errors.LockNotAvailable:
            time.sleep(min(0.05 * (attempt + 1), 1.0))
    raise PackError(f"the partition at {lower} is packed but could not take its place in the log:"
                    f" its locks were busy {FINISH_TRIES} times; run qforge pack again")
