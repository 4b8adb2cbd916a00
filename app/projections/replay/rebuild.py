"""Rebuild: fold the log (or its prefix up to a position) into fresh copies of the projections in a scratch schema.

The streams are independent, so several connections can fold at once, each
its share of the streams in position order, all reading one exported snapshot
of the log: the rebuild is the state of that one snapshot.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from qforge.projections.replay.common import (CHUNK_POSITIONS, META_TABLE, PROJECTIONS, REPLAY_LOCK_KEY,
                                              SCRATCH_SCHEMA, Progress, columns_of, create_scratch_tables,
                                              feed_name, fold_into, live_schema, refuse_live_schema,
                                              require_idle, scratch_names, template)
from qforge.projections.replay.archived import load_archive, release
from qforge.sql import q


@dataclass
class RebuildStats:
    schema: str
    as_of: int | None  # the position replayed up to; None: the whole log
    last_position: int  # the last position in what was folded
    events: int
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    folders: int = 1  # connections that folded at once

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def rebuild(conn, schema: str = SCRATCH_SCHEMA, as_of_position: int | None = None, *,
            progress: Progress | None = None, chunk_positions: int = CHUNK_POSITIONS,
            url: str | None = None, parallel: int = 1, archive: Path | None = None) -> RebuildStats:
    """Fold the log (up to as_of_position) into fresh copies of the projections in `schema`.

    `archive`: the archive directory, needed once segments have left the database
    (their events are folded first; a whole rebuild then lets go of what the
    archive holds whole, as `qforge archive` did).

    `parallel` > 1 (with the database `url`) folds with that many connections at
    once. `conn` must not be inside a transaction (a rebuild runs several).
    """
    require_idle(conn)
    folders = parallel if url and parallel > 1 else 1
    started = time.monotonic()
    names = scratch_names(schema)
    was_autocommit = conn.autocommit
    conn.autocommit = True  # several transactions: the scratch tables are committed before the folding
    conn.execute(q("replay_lock_scratch_session"), {"key": REPLAY_LOCK_KEY})
    try:
        live, feed = _make_scratch(conn, schema, names, archive, folders)
        extent, total = _fold_snapshot(conn, schema, names, live, feed, as_of_position, progress=progress,
                                       chunk_positions=chunk_positions, url=url, folders=folders)
        stats = RebuildStats(schema, as_of_position, extent["last_position"], total, folders=folders)
        _count_rows(conn, live, names, stats)
    finally:
        if not conn.closed:
            conn.execute(q("replay_unlock_scratch_session"), {"key": REPLAY_LOCK_KEY})
            conn.autocommit = was_autocommit
    stats.seconds = time.monotonic() - started
    return stats


def _make_scratch(conn, schema: str, names: dict, archive: Path | None, folders: int):
    """Fresh scratch tables (and the archive's events, loaded to fold first), committed: (the live
    schema, the archive's feed or None)."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        refuse_live_schema(cur, schema)
        live = live_schema(cur)
        cur.execute(template("replay_scratch_reset", schema=sql.Identifier(schema)))
        feed = load_archive(cur, archive, schema, live)
        create_scratch_tables(cur, schema, live, feeds=folders)
        cur.execute(template("replay_scratch_meta", meta=names[META_TABLE]))
    return live, feed


def _fold_snapshot(conn, schema: str, names: dict, live: str, feed, as_of_position: int | None, *,
                   progress: Progress | None, chunk_positions: int, url: str | None,
                   folders: int) -> tuple[dict, int]:
    """Fold one exported snapshot of the log with `folders` connections at once: (the log's
    extent folded, the events folded with the archive's)."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("replay_repeatable_read"))
        cur.execute(q("log_read_lock"))
        cur.execute(q("replay_work_mem"))
        cur.execute(q("replay_export_snapshot"))
        exported = cur.fetchone()["id"]
        cur.execute(q("replay_snapshot"))
        snapshot = cur.fetchone()["snapshot"]
        cur.execute(q("replay_log_extent"), {"as_of": as_of_position}, prepare=False)
        extent = cur.fetchone()
        first, total = extent["first_position"], extent["events"]
        if feed is not None:
            total += feed.events
            first = max(first, feed.before)  # a partition archived but not dropped yet: once
        done = [0] * folders
        report = _Progress(progress, done, total)

        def fold(cursor, n: int) -> None:
            share = (n, folders) if folders > 1 else None
            folded = 0
            if feed is not None:
                folded = fold_into(cursor, schema, live, first=1, last=feed.before - 1, as_of=as_of_position,
                                   share=share, chunk_positions=chunk_positions, feed_table=feed_name(n),
                                   source=feed.table, progress=lambda count, _total: report(n, count))
            fold_into(cursor, schema, live, first=first, last=extent["last_position"],
                      as_of=as_of_position, share=share, done=folded,
                      chunk_positions=chunk_positions, feed_table=feed_name(n),
                      progress=lambda count, _total: report(n, count))

        _fold_together(cur, url, exported, folders, fold)
        if feed is not None and as_of_position is None:
            release(cur, feed.before)  # the state as of a past position keeps what was there then
        cur.execute(template("replay_scratch_meta_write", meta=names[META_TABLE]), {
            "snapshot": snapshot, "as_of": as_of_position,
            "last_position": extent["last_position"], "events": extent["events"],
        })
    return extent, total


def _fold_together(cur, url: str | None, exported: str, folders: int, fold) -> None:
    """`fold` share 0 on `cur`, and shares 1.. on connections of their own (threads), in the
    exported snapshot; the first error of a helper is raised once all have ended."""
    helpers = [_Folder(url, exported, n, fold) for n in range(1, folders)]
    for helper in helpers:
        helper.start()
    try:
        fold(cur, 0)
    finally:
        for helper in helpers:
            helper.join()
    for helper in helpers:
        if helper.error is not None:
            raise helper.error


def _count_rows(conn, live: str, names: dict, stats: RebuildStats) -> None:
    """Analyze each rebuilt table and count its rows into `stats`."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        for projection in PROJECTIONS:
            target = names[projection.table]
            keys, _ = columns_of(cur, sql.Identifier(live, projection.table).as_string(cur))
            cur.execute(template("replay_scratch_analyze", target=target,
                                 keys=sql.SQL(", ").join(map(sql.Identifier, keys))))
            cur.execute(template("replay_row_count", target=target))
            stats.rows[projection.table] = cur.fetchone()["n"]


class _Progress:
    """Sums the folders' counts for one progress callback (called from several threads)."""

    def __init__(self, progress: Progress | None, done: list[int], total: int):
        self.progress, self.done, self.total = progress, done, total
        self.lock = threading.Lock()

    def __call__(self, folder: int, count: int) -> None:
        if self.progress is None:
            return
        with self.lock:
            self.done[folder] = count
            self.progress(sum(self.done), self.total)


class _Folder(threading.Thread):
    """One more connection folding its share of the streams, in the exported snapshot."""

    def __init__(self, url: str, snapshot: str, n: int, fold):
        super().__init__(name=f"qforge-replay-{n}", daemon=True)
        self.url, self.snapshot, self.n, self.fold = url, snapshot, n, fold
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
                    cur.execute(q("replay_repeatable_read"))
                    cur.execute(template("replay_import_snapshot", id=sql.Literal(self.snapshot)))
                    cur.execute(q("replay_work_mem"))
                    self.fold(cur, self.n)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the rebuild's own thread
            self.error = exc


def position_at(conn, moment: datetime) -> int:
    """The log position that "as of `moment`" means (see replay_position_at_time)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)  # naive times are UTC, as in the API
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("replay_position_at_time"), {"at": moment})
        return cur.fetchone()["position"]


def status_counts(conn, schema: str = SCRATCH_SCHEMA) -> dict[str, dict[str, int]]:
    """{"jobs": {status: n}, "workflows": {status: n}} of a rebuild."""
    names = scratch_names(schema)
    counts: dict[str, dict[str, int]] = {}
    with conn.cursor(row_factory=dict_row) as cur:
        for table in ("jobs", "workflows"):
            cur.execute(template("replay_status_counts", target=names[table]))
            counts[table] = {row["status"]: row["n"] for row in cur.fetchall()}
    return counts
