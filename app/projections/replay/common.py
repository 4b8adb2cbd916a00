"""What rebuild, verify, swap and as-of reads share: the projections, scratch tables, and the fold of the log into them.

The fold is the live path's own (events_project(), migrations/definitions/30_fold.sql):
the log is read in position order, a chunk at a time, and each chunk is folded
rank by rank (every stream's first event in the chunk, then every second
one, ...), with the scratch tables first on the search path. Replay equals live
by construction; verify proves it on a real database.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable
from uuid import UUID

from psycopg import sql
from psycopg.pq import TransactionStatus

from qforge.sql import q

SCRATCH_SCHEMA = "qforge_replay"
FEED_TABLE = "events_feed"
META_TABLE = "replay_meta"
CANDIDATES_TABLE = "replay_candidates"
# Positions per chunk: big enough that per-statement costs vanish, small enough
# for steady progress reports and modest memory per chunk.
CHUNK_POSITIONS = 50_000
# Fixed key of the advisory lock that keeps rebuilds and swaps out of each
# other's way ("QForge" in ASCII, then 0004; qforge.migrate uses ...0001).
REPLAY_LOCK_KEY = 0x5146_6F72_6765_0004
NIL_ID = UUID(int=0)


@dataclass(frozen=True)
class Projection:
    """A table of the read model that a fold on the log writes and replay compares and swaps.

    A feature that keeps a projection of its own (its fold a statement trigger
    on events, see replay_fold_triggers) adds its table here."""

    table: str
    # Compared in one statement rather than chunk by chunk: a table whose
    # primary key does not start with id would be scanned whole per chunk.
    verify_whole: bool = False
    # Of the scratch copy. A row the fold updates several times in one chunk (a
    # job: Claimed, then Succeeded) needs room on its page for its new versions:
    # the rebuild's own versions cannot be pruned before it commits, and an
    # update that finds no room writes a key entry too. 30 against 70 took ~15%
    # off a rebuild's CPU (bench: /proc schedstat of the rebuilding backend).
    fillfactor: int = 100


PROJECTIONS = (
    Projection("workflows", fillfactor=30),
    Projection("jobs", fillfactor=30),
    Projection("execution_tags", verify_whole=True),
    Projection("tokens"),  # API tokens (migrations/0011, definitions/70_tokens.sql)
    # flow control's settings (definitions/65_flow.sql, flow_fold)
    Projection("schedules", verify_whole=True),
    Projection("queue_settings", verify_whole=True),
    Projection("key_settings", verify_whole=True),  # per-key limits (migrations/0020)
    # stored definitions (definitions/60_definitions.sql): few and small
    Projection("definitions", verify_whole=True),
    Projection("definition_versions", verify_whole=True),
)

Progress = Callable[[int, int], None]  # (events read so far, events in the log)


class ReplayError(Exception):
    """A replay that cannot go on (no rebuild to swap, a rebuild of the past, locks not taken)."""


def require_idle(conn) -> None:
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise ValueError("replay needs a connection that is not inside a transaction"
                         " (it sets the isolation level of its own)")


def live_schema(cur) -> str:
    """Where the live projections are (public, unless QForge was installed elsewhere)."""
    cur.execute(q("replay_live_schema"))
    return cur.fetchone()["schema"]


def refuse_live_schema(cur, schema: str) -> None:
    """A rebuild drops and recreates its schema: never the one of the live tables."""
    live = live_schema(cur)
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
    """(primary key columns, other columns) of a live projection (`table`, a name as
    regclass reads it: qualify it), from the catalog, so that a column added by a later
    migration is compared and swapped too."""
    cur.execute(q("replay_table_columns"), {"table": table})
    rows = cur.fetchall()
    keys = [row["name"] for row in rows if row["is_key"]]
    if "id" not in keys:
        raise ReplayError(f"projection {table} needs an id column in its primary key")
    return keys, [row["name"] for row in rows if not row["is_key"]]


def create_scratch_tables(cur, schema: str | None, live: str, *, feeds: int = 1) -> None:
    """Empty copies of the projections (of schema `live`), with their primary keys:
    unlogged tables in `schema`, or (None) temporary tables that end with the transaction;
    and `feeds` feed tables carrying the log's fold triggers."""
    for projection in PROJECTIONS:
        source = sql.Identifier(live, projection.table)
        keys, _ = columns_of(cur, source.as_string(cur))
        if schema is None:
            target: sql.Composable = sql.Identifier(projection.table)
            cur.execute(template("replay_temp_table", target=target, source=source))
        else:
            target = sql.Identifier(schema, projection.table)
            cur.execute(template("replay_scratch_table", target=target, source=source,
                                 fillfactor=sql.Literal(projection.fillfactor)))
        cur.execute(template("replay_scratch_key", target=target,
                             keys=sql.SQL(", ").join(map(sql.Identifier, keys))))
    events = sql.Identifier(live, "events")
    cur.execute(q("replay_fold_triggers"), {"events": events.as_string(cur)})
    triggers = cur.fetchall()
    for n in range(feeds):
        name = feed_name(n)
        if schema is None:
            feed = sql.Identifier(name)
            cur.execute(template("replay_temp_feed_table", feed=feed, events=events))
        else:
            feed = sql.Identifier(schema, name)
            cur.execute(template("replay_feed_table", feed=feed, events=events))
        for trigger in triggers:
            cur.execute(template("replay_feed_trigger", trigger=sql.Identifier(trigger["name"]), feed=feed,
                                 new_table=sql.Identifier(trigger["new_table"]),
                                 function=sql.SQL(trigger["function"])))


def feed_name(n: int) -> str:
    """The feed table of a replay's n-th folder."""
    return FEED_TABLE if n == 0 else f"{FEED_TABLE}_{n}"


def fold_into(cur, schema: str | None, live: str, *, first: int, last: int, as_of: int | None = None,
              ids: list[UUID] | None = None, share: tuple[int, int] | None = None, total: int = 0,
              progress: Progress | None = None, chunk_positions: int = CHUNK_POSITIONS,
              feed_table: str = FEED_TABLE, source: sql.Composable | None = None, done: int = 0) -> int:
    """Fold the events at positions first..last (and up to as_of; only the streams in
    ids, or share = (part, parts) of the streams, when given) into the scratch tables of
    `schema` (None: this transaction's temporary ones). Returns the events folded. The
    search path stays pointed at the scratch tables until the transaction ends: keep the
    live tables schema-qualified (or use another transaction) after this."""
    scratch = "pg_temp" if schema is None else schema
    feed = sql.Identifier(scratch, feed_table)
    cur.execute(q("replay_search_path"), {"path": f"{sql.Identifier(scratch).as_string(cur)}, "
                                                  f"{sql.Identifier(live).as_string(cur)}"})
    load = template("replay_feed_load", feed=feed,
                    source=source if source is not None else sql.SQL(q("replay_live_source")))
    clear = template("replay_feed_clear", feed=feed)
    part, parts = share if share is not None else (None, None)
    folded = 0
    lo = first
    while lo <= last:
        hi = last + 1 if ids is not None else min(lo + chunk_positions, last + 1)
        cur.execute(clear)
        cur.execute(load, {"lo": lo, "hi": hi, "as_of": as_of, "ids": ids, "part": part, "parts": parts})
        folded += cur.rowcount
        if progress is not None:
            progress(done + folded, total)
        lo = hi
    return folded


def status_note(row: dict[str, Any] | None, prefix: str) -> str:
    if not row or "status" not in row:
        return ""
    return f" ({prefix}: status {show(row['status'])})"


def show(value: Any) -> str:
    return json.dumps(value, default=str, sort_keys=True)
