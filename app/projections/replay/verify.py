"""Verify: fold the log and compare it with the live projections, in one read-only snapshot, writing nothing."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg import sql
from psycopg.rows import dict_row

from qforge.projections.replay.common import (CHUNK_EVENTS, NIL_ID, PROJECTIONS, Progress, Projection,
                                              chunks, col, columns_of, join_on, require_idle,
                                              show, status_note, template)
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
    def id(self) -> UUID:
        return UUID(str(self.key["id"]))

    def describe(self) -> str:
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



def verify(conn, *, progress: Progress | None = None,
           chunk_events: int = CHUNK_EVENTS) -> list[Difference]:
    """Every row on which the live projections and the fold of the log differ (empty: none)."""
    return verify_report(conn, progress=progress, chunk_events=chunk_events).differences


def verify_report(conn, *, progress: Progress | None = None,
                  chunk_events: int = CHUNK_EVENTS) -> VerifyReport:
    """verify() with what was compared. One read-only REPEATABLE READ snapshot for the
    folds and the live rows: every command writes its events and its projection
    rows in one transaction, so a snapshot shows both or neither."""
    require_idle(conn)
    started = time.monotonic()
    differences: list[Difference] = []
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("replay_read_only_snapshot"))
        cur.execute(q("replay_work_mem"))
        cur.execute(q("replay_log_extent"), {"as_of": None}, prepare=False)
        extent = cur.fetchone()
        statements = {p.table: _compare_statement(cur, p) for p in PROJECTIONS}

        def compare(projection: Projection, lo: UUID, hi: UUID | None) -> None:
            cur.execute(statements[projection.table],
                        {"lo": lo, "hi": hi, "ids": None, "as_of": None}, prepare=False)
            differences.extend(_difference(projection.table, row) for row in cur.fetchall())

        for lo, hi in chunks(cur, chunk_events, extent["scanned"], progress):
            for projection in PROJECTIONS:
                if not projection.verify_whole:
                    compare(projection, lo, hi)
        for projection in PROJECTIONS:
            if projection.verify_whole:
                compare(projection, NIL_ID, None)
    return VerifyReport(differences, extent["last_position"], extent["events"],
                        time.monotonic() - started)


def _compare_statement(cur, projection: Projection) -> sql.Composed:
    keys, others = columns_of(cur, projection.table)
    live, rebuilt = sql.Identifier("l"), sql.Identifier("r")
    key = sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(
        sql.SQL("{}, coalesce({}, {})").format(sql.Literal(c), col(live, c), col(rebuilt, c))
        for c in keys))
    if others:
        differing = sql.SQL("array_remove(ARRAY[{}]::text[], NULL)").format(sql.SQL(", ").join(
            sql.SQL("CASE WHEN {} IS DISTINCT FROM {} THEN {} END").format(
                col(live, c), col(rebuilt, c), sql.Literal(c)) for c in others))
    else:
        differing = sql.SQL("ARRAY[]::text[]")
    return template("replay_compare", fold=sql.SQL(q(projection.fold)),
                     live=sql.Identifier(projection.table), key=key, join=join_on(keys),
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


