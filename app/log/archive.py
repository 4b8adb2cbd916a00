"""qforge archive: closed partitions of the log leave the database as archive segments, and nothing is lost.

For each closed partition, oldest first (the archived part of the log is a
prefix of its positions):

1. write the segment file (app/log/segments.py): synced, renamed into place;
2. read it back and check it against what the database counts (events, first
   and last position, a digest of every position with its hash) and recompute
   the hash of every event whose predecessor is known;
3. write the manifest;
4. record the segment (sealed);
5. let the read model go of the finished executions the archive now holds
   whole (archive_release_*), a window of the partition's positions at a
   time: the workflows, then the jobs, with events there;
6. detach the partition (CONCURRENTLY: appends go on), drop it, mark the
   segment dropped.

It is a batch job beside a live queue, and it yields to it: no parallel
workers, the partition read a window of positions at a time (no sort of the
whole partition), the release in short transactions, and between the pieces
of work it rests (Pace) so that it takes at most a share `duty` of one core's
time, on the database and here, and a smaller share `busy_duty` while the log
grows at a busy queue's pace.

Every step is idempotent and the database says where a run stopped (the
segment's row, the partition's detach state), so a run killed at any point is
simply run again: a step redone writes what it wrote before (a sealed segment
is released again, whole, before its partition goes).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from qforge.events.states import JOB_FINISHED, WORKFLOW_FINISHED
from qforge.log import segments
from qforge.log.common import LET_GO_LOCK, ArchiveError, Pace, paced, partition_identifier, settled_horizon
from qforge.sql import q

# Fault injection for the tests of crashes: QFORGE_ARCHIVE_FAULT=<step> kills
# this process with SIGKILL when the step is reached (see STEPS).
FAULT_ENV = "QFORGE_ARCHIVE_FAULT"
STEPS = ("written", "manifest", "recorded", "releasing", "released", "detached", "dropped")

Report = Callable[[str], None]
# Positions read per COPY of a partition (each sorted on its own, in memory).
READ_WINDOW = 50_000
# Positions of the partition whose workflows, then jobs, are looked at per
# transaction of the release (a no-op job has 3 events).
RELEASE_POSITIONS = 6_000
# The share of the time the archive works (the rest it rests) by default:
# QFORGE_ARCHIVE_DUTY or archive(duty=...); 1 never rests.
DUTY = 0.5
DUTY_ENV = "QFORGE_ARCHIVE_DUTY"
# The share while the queue is busy: QFORGE_ARCHIVE_BUSY_DUTY or
# archive(busy_duty=...). On 2 cores a drain kept 0.83x of its pace beside an
# archive at 0.5 and 0.95x beside one at 0.1 (bench/qf_scale.py --only-drain).
BUSY_DUTY = 0.1
BUSY_DUTY_ENV = "QFORGE_ARCHIVE_BUSY_DUTY"


def _share(env: str, default: float) -> float:
    raw = os.environ.get(env)
    try:
        return default if raw in (None, "") else float(raw)
    except ValueError:
        raise ValueError(f"{env} is a share of the time in (0, 1], not {raw!r}") from None


def default_duty() -> float:
    return _share(DUTY_ENV, DUTY)


def default_busy_duty() -> float:
    return _share(BUSY_DUTY_ENV, BUSY_DUTY)


@dataclass
class Archived:
    """What one run of qforge archive did."""

    segments: list[dict[str, Any]] = field(default_factory=list)  # manifests written or finished
    skipped: list[str] = field(default_factory=list)  # partitions left (too recent, still open)
    jobs_released: int = 0
    workflows_released: int = 0
    seconds: float = 0.0
    rested: float = 0.0  # of the seconds, resting (Pace)
    rests: int = 0  # times it rested
    busy_rests: int = 0  # of them, with the queue busy (at the busy duty)
    skipped_busy: bool = False  # wait=False and a pack or another archive held the lock

    @property
    def events(self) -> int:
        return sum(m["events"] for m in self.segments)


def _fault(step: str) -> None:
    if os.environ.get(FAULT_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def archive(conn, directory: Path, *, older_than: timedelta | None = None, close_current: bool = False,
            report: Report | None = None, duty: float | None = None,
            busy_duty: float | None = None, wait: bool = True,
            progress: Callable[[int, int | None], None] | None = None) -> Archived:
    """Archive every closed partition (whose last event is older than `older_than`, when
    given) into `directory`, working at most `duty` of the time (default_duty()), and
    at most `busy_duty` (default_busy_duty()) while the queue is busy (see Pace). With
    wait=False, do nothing (done.skipped_busy) while a pack or another archive is at work.
    `conn` must be in autocommit mode (detaching a partition concurrently runs outside
    any transaction block; the release is many short transactions). `progress(done, total)` hears
    of every window written, in log positions (total: those of the closed partitions)."""
    if not conn.autocommit:
        raise ValueError("archive needs an autocommit connection (DETACH CONCURRENTLY runs as its own transactions)")
    say = report or (lambda _line: None)
    pace = paced(conn, default_duty() if duty is None else duty,
                 default_busy_duty() if busy_duty is None else busy_duty)
    pace.progress = progress
    started = time.monotonic()
    done = Archived()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("archive_allow"))
        if wait:
            cur.execute(q("archive_let_go_lock"), {"key": LET_GO_LOCK})
        elif not cur.execute(q("archive_let_go_try_lock"), {"key": LET_GO_LOCK}).fetchone()["locked"]:
            done.skipped_busy = True
            return done
        try:
            _archive(conn, cur, directory, older_than, close_current, pace, done, say)
        finally:
            cur.execute(q("archive_let_go_unlock"), {"key": LET_GO_LOCK})
    done.seconds = time.monotonic() - started
    done.rested = pace.rested
    done.busy_rests, done.rests = pace.busy_rests, pace.rests
    return done


def _archive(conn, cur, directory: Path, older_than: timedelta | None, close_current: bool, pace: Pace,
             done: Archived, say: Report) -> None:
    """archive() with its session set up: the partitions, oldest first."""
    if close_current:
        cur.execute(q("archive_close_current"))
        say(f"closed the current partition: new appends start at position {cur.fetchone()['boundary']}")
        pace.look()
    horizon = settled_horizon(conn, cur)
    # A run that stopped after recording a segment: finish letting its partition go.
    cur.execute(q("archive_segments_recorded"))
    for row in cur.fetchall():
        if row["state"] == "sealed":
            _check_on_disk(directory, row)
            _release(cur, row["upper_position"], (row["first_position"], row["last_position"]), done, pace, say)
            _let_go(cur, row["segment"], row["lower_position"], say)
            done.segments.append(row["manifest"])
    cur.execute(q("archive_partitions"), {"horizon": horizon})
    partitions = cur.fetchall()
    pace.total = sum(part["upper"] - part["lower"] for part in partitions if part["closed"])
    cutoff = datetime.now(timezone.utc) - older_than if older_than is not None else None
    for part in partitions:
        if not part["closed"]:
            done.skipped.append(part["partition"])
            break  # this one is being written; so are all after it
        if cutoff is not None:
            cur.execute(sql.SQL(q("archive_partition_last_occurred")).format(partition=_source(part)))
            last = cur.fetchone()["last_occurred_at"]
            if last is not None and last >= cutoff:
                done.skipped.append(part["partition"])
                break  # later partitions are younger still: the archive stays a prefix
        before = pace.done
        manifest = _write_and_check(cur, directory, part, pace, say)
        pace.moved(part["upper"] - part["lower"] - (pace.done - before))  # the positions no event took
        _fault("manifest")
        _record(cur, manifest)
        _fault("recorded")
        _release(cur, manifest["partition"]["upper"], (manifest["first_position"], manifest["last_position"]),
                 done, pace, say)
        _fault("released")
        _let_go(cur, manifest["segment"], part["lower"], say)
        done.segments.append(manifest)


def _source(part: dict[str, Any], window: bool = False) -> sql.Composable:
    """What to read a partition's events from: the live partition's table, or for a packed
    one its range of the log (log_range; with window, only the positions [%(from)s, %(to)s)
    that the query is given, so that a window unpacks only its own blocks)."""
    if not part.get("packed"):
        return partition_identifier(part["partition"])
    if window:
        return sql.SQL("log_range(%(from)s, %(to)s)")
    return sql.SQL("log_range({}, {})").format(sql.Literal(part["lower"]), sql.Literal(part["upper"]))


def _write_and_check(cur, directory: Path, part: dict[str, Any], pace: Pace, say: Report) -> dict[str, Any]:
    name = segments.segment_name(part["lower"], part["upper"])
    cur.execute(sql.SQL(q("archive_partition_summary")).format(partition=_source(part)))
    summary = cur.fetchone()
    lines = _partition_lines(cur, _source(part, window=True), summary["first_position"], summary["last_position"],
                             pace)
    summary = {**summary, "first_occurred_at": _iso(summary["first_occurred_at"]),
               "last_occurred_at": _iso(summary["last_occurred_at"])}
    written, wrote = segments.write_segment(directory, name, part["lower"], part["upper"], lines, summary)
    pace.rest()
    _fault("written")
    _read_back(written, wrote, summary, pace)
    segments.write_manifest(directory, written.manifest)
    say(f"{name}: {written.manifest['events']:,} events, {written.manifest['raw_bytes']:,} bytes"
        f" -> {written.manifest['bytes']:,} compressed; verified")
    return written.manifest


def _iso(moment) -> str | None:
    return None if moment is None else moment.astimezone(timezone.utc).isoformat()


def _partition_lines(cur, partition: sql.Composable, first: int | None, last: int | None,
                     pace: Pace) -> Iterator[bytes]:
    """The partition's segment lines in position order, READ_WINDOW positions per COPY
    (the partition is closed: nothing is added to it between two), resting between."""
    if first is None:
        return
    statement = sql.SQL(q("archive_partition_lines")).format(partition=partition)
    for start in range(first, last + 1, READ_WINDOW):
        with cur.copy(statement, {"from": start, "to": min(start + READ_WINDOW, last + 1)}) as copy:
            yield from _lines(copy)
        pace.moved(min(start + READ_WINDOW, last + 1) - start)
        pace.rest()


def _lines(copy) -> Iterator[bytes]:
    """The lines of a COPY ... TO STDOUT of one text column of JSON (see archive_partition_lines).
    A block is most often one whole line: then it is taken as it is."""
    rest = b""
    for block in copy:
        data = bytes(block)
        if rest:
            data, rest = rest + data, b""
        if data.endswith(b"\n") and data.count(b"\n") == 1:
            yield data[:-1].replace(b"\\\\", b"\\")
            continue
        *whole, rest = data.split(b"\n")
        for line in whole:
            yield line.replace(b"\\\\", b"\\")
    if rest:
        yield rest.replace(b"\\\\", b"\\")


def _read_back(written: segments.Written, wrote: segments.Digest, summary: dict[str, Any], pace: Pace) -> None:
    """The segment as read from disk holds exactly what the database gave, and as many
    events as the partition holds: else stop, before anything is let go."""
    found = segments.digest_of(written.path, full=False, rest=pace.rest)
    problems = list(found.hash_problems)
    if (found.events, found.first_position, found.last_position, found.digest) != (
            wrote.events, wrote.first_position, wrote.last_position, wrote.digest):
        problems.append(f"{written.manifest['segment']}: read back {found.events} events"
                        f" {found.first_position}..{found.last_position}, not what was written"
                        f" ({wrote.events} events {wrote.first_position}..{wrote.last_position})")
    if (wrote.events, wrote.first_position, wrote.last_position) != (
            summary["events"], summary["first_position"], summary["last_position"]):
        problems.append(f"{written.manifest['segment']}: {wrote.events} events written, the partition holds"
                        f" {summary['events']} ({summary['first_position']}..{summary['last_position']})")
    if file_problems := segments.check_segment(written.path.parent, written.manifest, read=False):
        problems.extend(file_problems)
    if problems:
        raise ArchiveError("; ".join(problems) + " — nothing was let go")


def _record(cur, manifest: dict[str, Any]) -> None:
    bloom = segments.bloom_of(manifest)
    cur.execute(q("archive_record"), {
        "segment": manifest["segment"], "lower": manifest["partition"]["lower"],
        "upper": manifest["partition"]["upper"], "first_position": manifest["first_position"],
        "last_position": manifest["last_position"], "events": manifest["events"],
        "first_occurred_at": manifest["first_occurred_at"], "last_occurred_at": manifest["last_occurred_at"],
        "sha256": manifest["sha256"], "bytes": manifest["bytes"], "raw_bytes": manifest["raw_bytes"],
        "streams": bytes(bloom.bits), "bloom_hashes": bloom.hashes, "manifest": Jsonb(manifest),
    })


def _release(cur, before: int, extent: tuple[int | None, int | None], done: Archived, pace: Pace,
             say: Report) -> None:
    """The read model lets go of the finished executions wholly below `before` (recorded
    as archived) that have events in the segment's `extent` (first and last position),
    RELEASE_POSITIONS positions at a time, resting between windows, each its own short
    transaction: the workflows (with their steps), then the jobs outside workflows. After
    a crash it is simply done again (the segment is sealed and its partition still
    attached): what was let go is gone, the rest goes."""
    jobs = workflows = 0
    first, last = extent
    for start in range(first, last + 1, RELEASE_POSITIONS) if first is not None else ():
        window = {"before": before, "job_done": sorted(JOB_FINISHED), "workflow_done": sorted(WORKFLOW_FINISHED),
                  "from": start, "to": min(start + RELEASE_POSITIONS, last + 1)}
        for query in ("archive_release_workflows", "archive_release_jobs"):
            cur.execute(q(query), window)
            row = cur.fetchone()
            jobs += row["jobs_released"]
            workflows += row.get("workflows_released", 0)
            pace.rest()
            if jobs or workflows:
                _fault("releasing")
    done.jobs_released += jobs
    done.workflows_released += workflows
    say(f"positions below {before}: the read model let go of {jobs:,} jobs and {workflows:,} workflows")


def _check_on_disk(directory: Path, row: dict[str, Any]) -> None:
    """A recorded segment's file must still be there, unchanged, before its partition goes."""
    problems = segments.check_segment(directory, row["manifest"])
    if problems:
        raise ArchiveError("; ".join(problems) + f" — the partition of {row['segment']} is kept;"
                           " restore the segment file into the archive directory and run again")


def _let_go(cur, segment: str, lower: int, say: Report) -> None:
    """Detach and drop the partition at `lower`: the live one, or the packed one (qforge
    pack); a table of blocks still being filled for it goes too. The log's owner detaches
    CONCURRENTLY; another role (the monitor's, archiving by retention) asks the definer
    function log_archive_let_go, which cannot."""
    if not cur.execute(q("archive_owns_log")).fetchone()["owner"]:
        _let_go_for_role(cur, lower)
        cur.execute(q("archive_pack_forget"), {"lower": lower})
        cur.execute(q("archive_mark_dropped"), {"segment": segment})
        say(f"{segment}: partition at {lower} detached and dropped")
        return
    cur.execute(q("archive_pack_state"), {"lower": lower})
    pack = cur.fetchone()
    packed = pack is not None and pack["state"] == "packed"
    name = f"events_packed_{lower:019d}" if packed else f"events_{lower:019d}"
    cur.execute(q("archive_detached_table"), {"name": name})
    found = cur.fetchone()
    partition, log = sql.Identifier(name), sql.Identifier("events_packed" if packed else "events")
    if found["name"] is not None:
        if found["attached"]:
            if found["pending"]:
                cur.execute(sql.SQL(q("archive_detach_finalize")).format(log=log, partition=partition))
            else:
                cur.execute(sql.SQL(q("archive_detach")).format(log=log, partition=partition))
            _fault("detached")
        cur.execute(sql.SQL(q("archive_drop")).format(partition=partition))
        _fault("dropped")
    if pack is not None:
        if not packed:  # its blocks were being filled: they go with it
            cur.execute(sql.SQL(q("archive_drop_if_exists")).format(
                partition=sql.Identifier(f"events_packed_{lower:019d}")))
        cur.execute(q("archive_pack_forget"), {"lower": lower})
    cur.execute(q("archive_mark_dropped"), {"segment": segment})
    say(f"{segment}: partition {name} detached and dropped")


# How often a detach for a role that does not own the log waits LET_GO_LOCK_TIMEOUT for the
# log's lock before giving up (its ACCESS EXCLUSIVE request holds up appends while it waits).
LET_GO_TRIES = 50
LET_GO_LOCK_TIMEOUT = "200ms"


def _let_go_for_role(cur, lower: int) -> None:
    for attempt in range(LET_GO_TRIES):
        try:
            with cur.connection.transaction():
                cur.execute(q("pack_lock_timeout"), {"timeout": LET_GO_LOCK_TIMEOUT})
                cur.execute(q("archive_let_go_for_role"), {"lower": lower})
            _fault("dropped")
            return
        except psycopg.errors.LockNotAvailable:
            time.sleep(min(0.05 * (attempt + 1), 1.0))
    raise ArchiveError(f"the partition at {lower} is archived but its locks were busy {LET_GO_TRIES} times;"
                       " it goes at the next run")
