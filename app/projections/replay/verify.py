"""Verify: fold the log and compare it with the live projections, in one snapshot, changing nothing live.

The fold writes into temporary copies of the projections (this transaction's
own), so verify runs while the system works: every command writes its events
and its projection rows in one transaction, so the snapshot shows both or
neither.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from psycopg import sql
from psycopg.rows import dict_row

from qforge.projections.replay.common import (CHUNK_POSITIONS, PROJECTIONS, Progress, col, columns_of,
                                              create_scratch_tables, fold_into, join_on, live_schema,
                                              require_idle, show, status_note, template)
from qforge.projections.replay.archived import load_archive, release
from qforge.sql import q


@dataclass(frozen=True)
class Difference:
    """One row on which a live projection and the fold of the log disagree."""

    table: str
    key: dict[str, Any]  # the row's primary key
    kind: str  # "differs" | "missing" (not in the live table) | "extra" (not in the log)
    columns: dict[str, tuple[Any, Any]]  # differing column -> (live value, rebuilt value)
    live: dict[str, Any] | None = None
    rebuilt: dict[str, Any] | None = None

    @property
    def id(self) -> UUID | None:
        return UUID(str(self.key["id"])) if "id" in self.key else None

    def describe(self) -> str:
        if self.table == "queue_counts":
            (counted, actual), = self.columns.values()
            return (f"queue_counts queue {self.key['queue']} status {self.key['status']}: counted {counted},"
                    f" jobs hold {actual}")
        name = f"{self.table} {self.id}"
        if self.table == "execution_tags":
            name = f"{self.table} {self.key['kind']} {self.id} tag {self.key['key']}={self.key['value']}"
        if self.kind == "missing":
            return f"{name}: missing from the live table{status_note(self.rebuilt, 'the log has it')}"
        if self.kind == "extra":
            return f"{name}: not in the log{status_note(self.live, 'the live table has it')}"
        return f"{name}: " + "; ".join(
            f"{column} live {show(live)} rebuilt {show(rebuilt)}"
            for column, (live, rebuilt) in self.columns.items())


@dataclass
class VerifyReport:
    differences: list[Difference]
    last_position: int
    events: int
    seconds: float


def verify(conn, *, progress: Progress | None = None, chunk_positions: int = CHUNK_POSITIONS,
           archive: Path | None = None) -> list[Difference]:
    """Every row on which the live projections and the fold of the log differ (empty: none).
    `archive`: the archive directory, needed once segments have left the database."""
    return verify_report(conn, progress=progress, chunk_positions=chunk_positions, archive=archive).differences


def verify_report(conn, *, progress: Progress | None = None, chunk_positions: int = CHUNK_POSITIONS,
                  archive: Path | None = None) -> VerifyReport:
    """verify() with what was compared."""
    require_idle(conn)
    started = time.monotonic()
    differences: list[Difference] = []
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("replay_repeatable_read"))
        cur.execute(q("log_read_lock"))
        cur.execute(q("replay_work_mem"))
        live = live_schema(cur)
        cur.execute(q("replay_log_extent"), {"as_of": None}, prepare=False)
        extent = cur.fetchone()
        statements = {p.table: _compare_statement(cur, live, p.table) for p in PROJECTIONS}
        feed = load_archive(cur, archive, None, live)
        create_scratch_tables(cur, None, live)
        total, done, first = extent["events"], 0, extent["first_position"]
        if feed is not None:
            total += feed.events
            done = fold_into(cur, None, live, first=1, last=feed.before - 1, total=total, progress=progress,
                             chunk_positions=chunk_positions, source=feed.table)
            first = max(first, feed.before)  # a partition archived but not dropped yet: once
        fold_into(cur, None, live, first=first, last=extent["last_position"], total=total,
                  progress=progress, chunk_positions=chunk_positions, done=done)
        if feed is not None:
            release(cur, feed.before)
        for projection in PROJECTIONS:
            cur.execute(statements[projection.table], prepare=False)
            differences.extend(_difference(projection.table, row) for row in cur.fetchall())
        cur.execute(template("replay_compare_counts", counts=sql.Identifier(live, "queue_counts"),
                             deltas=sql.Identifier(live, "queue_count_deltas"),
                             jobs=sql.Identifier(live, "jobs")), prepare=False)
        differences.extend(
            Difference("queue_counts", {"queue": row["queue"], "status": row["status"]}, "differs",
                       {"n": (row["counted"], row["actual"])}) for row in cur.fetchall())
    return VerifyReport(differences, extent["last_position"], total, time.monotonic() - started)


def _compare_statement(cur, live: str, table: str) -> sql.Composed:
    keys, others = columns_of(cur, sql.Identifier(live, table).as_string(cur))
    live_alias, rebuilt_alias = sql.Identifier("l"), sql.Identifier("r")
    key = sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(
        sql.SQL("{}, coalesce({}, {})").format(sql.Literal(c), col(live_alias, c), col(rebuilt_alias, c))
        for c in keys))
    if others:
        differing = sql.SQL("array_remove(ARRAY[{}]::text[], NULL)").format(sql.SQL(", ").join(
            sql.SQL("CASE WHEN {} IS DISTINCT FROM {} THEN {} END").format(
                col(live_alias, c), col(rebuilt_alias, c), sql.Literal(c)) for c in others))
    else:
        differing = sql.SQL("ARRAY[]::text[]")
    return template("replay_compare", live=sql.Identifier(live, table),
                    rebuilt=sql.Identifier("pg_temp", table), key=key, join=join_on(keys),
                    differing=differing)


def _difference(table: str, row: dict[str, Any]) -> Difference:
    live, rebuilt = row["live_row"], row["rebuilt_row"]
    if row["missing"]:
        kind = "missing"
    elif row["extra"]:
        kind = "extra"
    else:
        kind = "differs"
    columns = {c: (live.get(c), rebuilt.get(c)) for c in row["columns"]} if kind == "differs" else {}
    return Difference(table, row["key"], kind, columns, live, rebuilt)
