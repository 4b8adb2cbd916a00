"""What rebuild, verify and swap share: the projections they fold, scratch names, SQL templates."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator
from uuid import UUID

from psycopg import sql
from psycopg.pq import TransactionStatus

from qforge.sql import q

SCRATCH_SCHEMA = "qforge_replay"
META_TABLE = "replay_meta"
CANDIDATES_TABLE = "replay_candidates"
# Events per chunk: big enough that per-statement costs vanish, small enough
# for steady progress reports and modest memory per fold.
CHUNK_EVENTS = 50_000
# Fixed key of the advisory lock that keeps rebuilds and swaps out of each
# other's way ("QForge" in ASCII, then 0004; app/migrate.py uses ...0001).
REPLAY_LOCK_KEY = 0x5146_6F72_6765_0004
NIL_ID = UUID(int=0)


@dataclass(frozen=True)
class Projection:
    """A projection table and the query that folds the log into its rows."""

    table: str
    fold: str
    # Compared in one statement rather than chunk by chunk: a table whose
    # primary key does not start with id would be scanned whole per chunk.
    verify_whole: bool = False


PROJECTIONS = (
    Projection("workflows", "replay_workflows"),
    Projection("jobs", "replay_jobs"),
    Projection("execution_tags", "replay_execution_tags", verify_whole=True),
)

Progress = Callable[[int, int], None]  # (events read so far, events in the log)


class ReplayError(Exception):
    """A replay that cannot go on (no rebuild to swap, a rebuild of the past, locks not taken)."""



def require_idle(conn) -> None:
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise ValueError("replay needs a connection that is not inside a transaction"
                         " (it sets the isolation level of its own)")


def refuse_live_schema(cur, schema: str) -> None:
    """A rebuild drops and recreates its schema: never the one of the live tables."""
    cur.execute(q("replay_live_schema"))
    live = cur.fetchone()["schema"]
    if schema == live or schema.startswith("pg_") or schema == "information_schema":
        raise ReplayError(f"schema {schema} cannot be a scratch schema: a rebuild drops it"
                          f" (the live projections are in {live})")


def scratch_names(schema: str) -> dict[str, sql.Composable]:
    tables = [p.table for p in PROJECTIONS] + [META_TABLE, CANDIDATES_TABLE]
    return {table: sql.Identifier(schema, table) for table in tables}


def template(name: str, **parts: sql.Composable) -> sql.Composed:
    return sql.SQL(q(name)).format(**parts)


def col(alias: sql.Identifier, column: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(alias, sql.Identifier(column))


def any_differs(columns: list[str]) -> sql.Composable:
    if not columns:
        return sql.SQL("false")
    return sql.SQL(" OR ").join(
        sql.SQL("l.{} IS DISTINCT FROM r.{}").format(sql.Identifier(c), sql.Identifier(c))
        for c in columns)


def join_on(keys: list[str]) -> sql.Composed:
    return sql.SQL(" AND ").join(
        sql.SQL("l.{} = r.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in keys)


def columns_of(cur, table: str) -> tuple[list[str], list[str]]:
    """(primary key columns, other columns) of a live projection, from the catalog,
    so that a column added by a later migration is compared and swapped too."""
    cur.execute(q("replay_table_columns"), {"table": table})
    rows = cur.fetchall()
    keys = [row["name"] for row in rows if row["is_key"]]
    if "id" not in keys:
        raise ReplayError(f"projection {table} needs an id column in its primary key")
    return keys, [row["name"] for row in rows if not row["is_key"]]


def insert_folded(cur, target: sql.Composable, projection: Projection,
                   params: dict[str, Any]) -> int:
    cur.execute(template("replay_insert", target=target, fold=sql.SQL(q(projection.fold))),
                params, prepare=False)
    return cur.fetchone()["n"]


def chunks(cur, size: int, total: int,
            progress: Progress | None) -> Iterator[tuple[UUID, UUID | None]]:
    """[lo, hi) ranges of stream ids holding about `size` events each; hi None: the end."""
    lo, done = NIL_ID, 0
    while True:
        cur.execute(q("replay_chunk_end"), {"lo": lo, "size": size}, prepare=False)
        row = cur.fetchone()
        hi = None if row is None else row["stream_id"]
        yield lo, hi
        done = total if hi is None else min(done + size, total)
        if progress is not None:
            progress(done, total)
        if hi is None:
            return
        lo = hi


def status_note(row: dict[str, Any] | None, prefix: str) -> str:
    if not row or "status" not in row:
        return ""
    return f" ({prefix}: status {show(row['status'])})"


def show(value: Any) -> str:
    return json.dumps(value, default=str, sort_keys=True)


