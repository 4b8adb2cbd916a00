"""Swap: make the live projections equal to a rebuild, atomically, with writers waiting only for the delta."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from qforge.projections.replay.common import (CANDIDATES_TABLE, META_TABLE, PROJECTIONS, REPLAY_LOCK_KEY,
                                              SCRATCH_SCHEMA, Progress, ReplayError, any_differs, col,
                                              columns_of, fold_into, join_on, live_schema, require_idle,
                                              scratch_names, template)
from qforge.projections.replay.rebuild import RebuildStats, rebuild
from qforge.projections.replay.archived import archive_extent, archive_table
from qforge.sql import q


@dataclass
class SwapStats:
    refolded_streams: int  # streams that changed between the rebuild and the swap
    marked: int = 0  # rows found differing before the locks
    deleted: dict[str, int] = field(default_factory=dict)
    updated: dict[str, int] = field(default_factory=dict)
    inserted: dict[str, int] = field(default_factory=dict)
    lock_seconds: float = 0.0
    attempts: int = 1

    @property
    def changed(self) -> int:
        return sum(self.deleted.values()) + sum(self.updated.values()) + sum(self.inserted.values())



def swap(conn, schema: str = SCRATCH_SCHEMA, *, lock_timeout: float = 0.2,
         give_up_after: float = 60.0) -> SwapStats:
    """Make the live projections equal to the rebuild in `schema`, in one transaction.

    First, without locks, the rows that differ are marked. Then, under locks
    that stop writers (replay_lock_writers), the streams that got events since
    the rebuild's snapshot are folded again and only the marked rows and those
    streams are deleted, updated or inserted. The locks are tried with a short
    lock_timeout, well under PostgreSQL's deadlock_timeout, and retried with
    jitter: a command holding one projection while it waits for another never
    gets a deadlock error, the swap steps back instead.
    """
    require_idle(conn)
    if not conn.autocommit:
        raise ValueError("swap needs an autocommit connection: it runs several transactions")
    conn.execute(q("replay_lock_scratch_session"), {"key": REPLAY_LOCK_KEY})
    try:
        return _swap(conn, schema, lock_timeout, give_up_after)
    finally:
        if not conn.closed:
            conn.execute(q("replay_unlock_scratch_session"), {"key": REPLAY_LOCK_KEY})


def _swap(conn, schema: str, lock_timeout: float, give_up_after: float) -> SwapStats:
    names = scratch_names(schema)
    meta = _read_meta(conn, schema, names)
    if meta["as_of"] is not None:
        raise ReplayError(f"schema {schema} holds the state as of position {meta['as_of']};"
                          " only a rebuild of the whole log can replace the live tables")
    marked = _mark_candidates(conn, names)
    deadline = time.monotonic() + give_up_after
    attempt = 0
    while True:
        attempt += 1
        try:
            stats = _swap_once(conn, schema, names, meta["snapshot"], lock_timeout)
        except psycopg.errors.LockNotAvailable:
            if time.monotonic() >= deadline:
                raise ReplayError(f"could not lock the projections against writers within "
                                  f"{give_up_after:g} s ({attempt} tries)") from None
            time.sleep(random.uniform(0.05, 0.3) * min(attempt, 5))
            continue
        stats.attempts, stats.marked = attempt, marked
        return stats


def replay(conn, schema: str = SCRATCH_SCHEMA, *, progress: Progress | None = None,
           url: str | None = None, parallel: int = 1, archive=None) -> tuple[RebuildStats, SwapStats]:
    """`qforge replay`: rebuild the whole log (with `parallel` connections to `url`, and the
    archive directory's segments when some have left the database), then swap the rebuild in."""
    built = rebuild(conn, schema, progress=progress, url=url, parallel=parallel, archive=archive)
    return built, swap(conn, schema)


def _mark_candidates(conn, names: dict[str, sql.Composable]) -> int:
    marked = 0
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        live = live_schema(cur)
        cur.execute(template("replay_candidates_reset", candidates=names[CANDIDATES_TABLE]))
        for projection in PROJECTIONS:
            keys, others = columns_of(cur, sql.Identifier(live, projection.table).as_string(cur))
            cur.execute(template(
                "replay_candidates_mark", candidates=names[CANDIDATES_TABLE],
                live=sql.Identifier(live, projection.table), scratch=names[projection.table],
                join=join_on(keys), any_differs=any_differs(others)))
            marked += cur.rowcount
    return marked


def _swap_once(conn, schema: str, names: dict[str, sql.Composable], snapshot: str,
               lock_timeout: float) -> SwapStats:
    candidates = names[CANDIDATES_TABLE]
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        live = live_schema(cur)
        columns = {p.table: columns_of(cur, sql.Identifier(live, p.table).as_string(cur)) for p in PROJECTIONS}
        cur.execute(q("replay_lock_timeout"), {"timeout": f"{int(lock_timeout * 1000)}ms"})
        cur.execute(q("replay_lock_writers"))
        locked_at = time.monotonic()
        # Nothing can append now, and every writer that had begun has ended:
        # each statement from here on sees the whole log.
        cur.execute(q("replay_streams_since"), {"snapshot": snapshot})
        changed = [row["stream_id"] for row in cur.fetchall()]
        stats = SwapStats(refolded_streams=len(changed))
        if changed:
            for projection in PROJECTIONS:
                cur.execute(template("replay_forget", target=names[projection.table]), {"ids": changed})
            cur.execute(q("replay_log_extent"), {"as_of": None})
            extent = cur.fetchone()
            archived = archive_table(cur, schema)
            first = extent["first_position"]
            if archived is not None:  # streams whose first events left with the archive
                last_archived = archive_extent(cur, archived, None)["last_position"]
                fold_into(cur, schema, live, first=1, last=last_archived, ids=changed, source=archived)
                first = max(first, last_archived + 1)
            fold_into(cur, schema, live, first=first, last=extent["last_position"], ids=changed)
            cur.execute(template("replay_candidates_add", candidates=candidates),
                        {"ids": changed})
        for projection in PROJECTIONS:
            _reconcile(cur, sql.Identifier(live, projection.table), columns[projection.table],
                       names[projection.table], candidates, stats, projection.table)
        cur.execute(template("replay_scratch_meta_touch", meta=names[META_TABLE]))
        stats.lock_seconds = time.monotonic() - locked_at
    return stats


def _reconcile(cur, live: sql.Identifier, columns: tuple[list[str], list[str]], scratch: sql.Composable,
               candidates: sql.Composable, stats: SwapStats, table: str) -> None:
    """Delete, update and insert the candidate live rows that differ from the rebuild."""
    keys, others = columns
    rebuilt = sql.Identifier("r")
    shared = {"live": live, "scratch": scratch, "candidates": candidates, "join": join_on(keys)}
    cur.execute(template("replay_swap_delete", **shared))
    stats.deleted[table] = cur.rowcount
    stats.updated[table] = 0
    if others:
        cur.execute(template(
            "replay_swap_update", **shared, any_differs=any_differs(others),
            assignments=sql.SQL(", ").join(
                sql.SQL("{} = {}").format(sql.Identifier(c), col(rebuilt, c)) for c in others)))
        stats.updated[table] = cur.rowcount
    every = keys + others
    cur.execute(template(
        "replay_swap_insert", **shared,
        columns=sql.SQL(", ").join(sql.Identifier(c) for c in every),
        scratch_columns=sql.SQL(", ").join(col(rebuilt, c) for c in every)))
    stats.inserted[table] = cur.rowcount


def _read_meta(conn, schema: str, names: dict[str, sql.Composable]) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("replay_scratch_exists"), {"schema": schema, "table": META_TABLE})
        if not cur.fetchone()["present"]:
            raise ReplayError(f"no rebuild in schema {schema}: run rebuild() first")
        cur.execute(template("replay_scratch_meta_read", meta=names[META_TABLE]))
        return cur.fetchone()


