"""Rebuild: fold the log (or its prefix up to a position) into fresh copies of the projections in a scratch schema."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from psycopg import sql
from psycopg.rows import dict_row

from qforge.projections.replay.common import (CHUNK_POSITIONS, META_TABLE, PROJECTIONS, REPLAY_LOCK_KEY,
                                              SCRATCH_SCHEMA, Progress, create_scratch_tables, fold_into,
                                              live_schema, refuse_live_schema, require_idle,
                                              scratch_names, template)
from qforge.sql import q


@dataclass
class RebuildStats:
    schema: str
    as_of: int | None  # the position replayed up to; None: the whole log
    last_position: int  # the last position in what was folded
    events: int
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def rebuild(conn, schema: str = SCRATCH_SCHEMA, as_of_position: int | None = None, *,
            progress: Progress | None = None, chunk_positions: int = CHUNK_POSITIONS) -> RebuildStats:
    """Fold the log (up to as_of_position) into fresh copies of the projections in `schema`.

    One REPEATABLE READ transaction: the rebuild is the state of one snapshot,
    which is recorded in the schema so that swap() knows what came after.
    `conn` must not be inside a transaction.
    """
    require_idle(conn)
    started = time.monotonic()
    names = scratch_names(schema)
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("replay_repeatable_read"))
        refuse_live_schema(cur, schema)
        live = live_schema(cur)
        cur.execute(q("replay_work_mem"))
        cur.execute(q("replay_snapshot"))
        snapshot = cur.fetchone()["snapshot"]
        # Waiting here for another rebuild or swap is harmless: the snapshot
        # is taken, and swap() folds whatever came after it.
        cur.execute(q("replay_lock_scratch"), {"key": REPLAY_LOCK_KEY})
        cur.execute(q("replay_log_extent"), {"as_of": as_of_position}, prepare=False)
        extent = cur.fetchone()
        cur.execute(template("replay_scratch_reset", schema=sql.Identifier(schema)))
        create_scratch_tables(cur, schema, live)
        cur.execute(template("replay_scratch_meta", meta=names[META_TABLE]))
        fold_into(cur, schema, live, first=extent["first_position"], last=extent["last_position"],
                  as_of=as_of_position, total=extent["events"], progress=progress,
                  chunk_positions=chunk_positions)
        stats = RebuildStats(schema, as_of_position, extent["last_position"], extent["events"])
        for projection in PROJECTIONS:
            target = names[projection.table]
            cur.execute(template("replay_scratch_analyze", target=target))
            cur.execute(template("replay_row_count", target=target))
            stats.rows[projection.table] = cur.fetchone()["n"]
        cur.execute(template("replay_scratch_meta_write", meta=names[META_TABLE]), {
            "snapshot": snapshot, "as_of": as_of_position,
            "last_position": extent["last_position"], "events": extent["events"],
        })
    stats.seconds = time.monotonic() - started
    return stats


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
