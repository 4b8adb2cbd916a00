"""Replay: rebuild the projections from the event log, verify them against the live tables, swap them in.

The projections (jobs, workflows, execution_tags) are folds of the log. The
live path folds each insert in the events_project() trigger with job_apply /
workflow_apply; replay folds the whole log with job_fold / workflow_fold, the
aggregates of those same functions (queries in app/sql/replay.sql), so replay
equals live by construction and `verify` proves it on a real database.

- rebuild: fold the log (or its prefix up to a position) into a scratch
  schema, chunk by chunk of streams in one REPEATABLE READ snapshot.
- verify: fold and compare chunk by chunk with the live tables, in one
  read-only snapshot, so it runs while the system works; nothing is written.
- swap: make the live tables equal to a rebuild, atomically. It marks the
  rows that differ without locks; then, in one transaction under locks that
  stop writers (not readers), it folds again the streams that got events
  since the rebuild's snapshot and deletes, updates and inserts only those
  rows and the marked ones. The live tables stay the same tables, so their
  indexes, the events_project() trigger and the functions typed on their rows
  stay valid, and writers wait for the delta, not for the whole replay.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, TextIO
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from app.sql import q

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
            return f"{name}: missing from the live table{_status_note(self.rebuilt, 'the log has it')}"
        if self.kind == "extra":
            return f"{name}: not in the log{_status_note(self.live, 'the live table has it')}"
        return f"{name}: " + "; ".join(
            f"{column} live {_show(live)} rebuilt {_show(rebuilt)}"
            for column, (live, rebuilt) in self.columns.items())


@dataclass
class VerifyReport:
    differences: list[Difference]
    last_position: int
    events: int
    seconds: float


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


class ReplayError(Exception):
    """A replay that cannot go on (no rebuild to swap, a rebuild of the past, locks not taken)."""


# ---------------------------------------------------------------------------
# rebuild


def rebuild(conn, schema: str = SCRATCH_SCHEMA, as_of_position: int | None = None, *,
            progress: Progress | None = None, chunk_events: int = CHUNK_EVENTS) -> RebuildStats:
    """Fold the log (up to as_of_position) into fresh copies of the projections in `schema`.

    One REPEATABLE READ transaction: the rebuild is the state of one snapshot,
    which is recorded in the schema so that swap() knows what came after.
    `conn` must not be inside a transaction.
    """
    _require_idle(conn)
    started = time.monotonic()
    names = _scratch_names(schema)
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("replay_repeatable_read"))
        _refuse_live_schema(cur, schema)
        cur.execute(q("replay_work_mem"))
        cur.execute(q("replay_snapshot"))
        snapshot = cur.fetchone()["snapshot"]
        # Waiting here for another rebuild or swap is harmless: the snapshot
        # is taken, and swap() folds whatever came after it.
        cur.execute(q("replay_lock_scratch"), {"key": REPLAY_LOCK_KEY})
        cur.execute(q("replay_log_extent"), {"as_of": as_of_position}, prepare=False)
        extent = cur.fetchone()
        cur.execute(_template("replay_scratch_reset", schema=sql.Identifier(schema)))
        for projection in PROJECTIONS:
            cur.execute(_template("replay_scratch_table", target=names[projection.table],
                                  source=sql.Identifier(projection.table)))
        cur.execute(_template("replay_scratch_meta", meta=names[META_TABLE]))
        stats = RebuildStats(schema, as_of_position, extent["last_position"], extent["events"],
                             {p.table: 0 for p in PROJECTIONS})
        for lo, hi in _chunks(cur, chunk_events, extent["scanned"], progress):
            params = {"lo": lo, "hi": hi, "ids": None, "as_of": as_of_position}
            for projection in PROJECTIONS:
                stats.rows[projection.table] += _insert_folded(cur, names[projection.table],
                                                               projection, params)
        for projection in PROJECTIONS:
            keys, _ = _columns(cur, projection.table)
            target = names[projection.table]
            cur.execute(_template("replay_scratch_key", target=target,
                                  keys=sql.SQL(", ").join(map(sql.Identifier, keys))))
            cur.execute(_template("replay_scratch_analyze", target=target))
        cur.execute(_template("replay_scratch_meta_write", meta=names[META_TABLE]), {
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
    names = _scratch_names(schema)
    counts: dict[str, dict[str, int]] = {}
    with conn.cursor(row_factory=dict_row) as cur:
        for table in ("jobs", "workflows"):
            cur.execute(_template("replay_status_counts", target=names[table]))
            counts[table] = {row["status"]: row["n"] for row in cur.fetchall()}
    return counts


# ---------------------------------------------------------------------------
# verify


def verify(conn, *, progress: Progress | None = None,
           chunk_events: int = CHUNK_EVENTS) -> list[Difference]:
    """Every row on which the live projections and the fold of the log differ (empty: none)."""
    return verify_report(conn, progress=progress, chunk_events=chunk_events).differences


def verify_report(conn, *, progress: Progress | None = None,
                  chunk_events: int = CHUNK_EVENTS) -> VerifyReport:
    """verify() with what was compared. One read-only REPEATABLE READ snapshot for the
    folds and the live rows: every command writes its events and its projection
    rows in one transaction, so a snapshot shows both or neither."""
    _require_idle(conn)
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

        for lo, hi in _chunks(cur, chunk_events, extent["scanned"], progress):
            for projection in PROJECTIONS:
                if not projection.verify_whole:
                    compare(projection, lo, hi)
        for projection in PROJECTIONS:
            if projection.verify_whole:
                compare(projection, NIL_ID, None)
    return VerifyReport(differences, extent["last_position"], extent["events"],
                        time.monotonic() - started)


def _compare_statement(cur, projection: Projection) -> sql.Composed:
    keys, others = _columns(cur, projection.table)
    live, rebuilt = sql.Identifier("l"), sql.Identifier("r")
    key = sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(
        sql.SQL("{}, coalesce({}, {})").format(sql.Literal(c), _col(live, c), _col(rebuilt, c))
        for c in keys))
    if others:
        differing = sql.SQL("array_remove(ARRAY[{}]::text[], NULL)").format(sql.SQL(", ").join(
            sql.SQL("CASE WHEN {} IS DISTINCT FROM {} THEN {} END").format(
                _col(live, c), _col(rebuilt, c), sql.Literal(c)) for c in others))
    else:
        differing = sql.SQL("ARRAY[]::text[]")
    return _template("replay_compare", fold=sql.SQL(q(projection.fold)),
                     live=sql.Identifier(projection.table), key=key, join=_join(keys),
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


# ---------------------------------------------------------------------------
# swap


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
    _require_idle(conn)
    if not conn.autocommit:
        raise ValueError("swap needs an autocommit connection: it runs several transactions")
    conn.execute(q("replay_lock_scratch_session"), {"key": REPLAY_LOCK_KEY})
    try:
        return _swap(conn, schema, lock_timeout, give_up_after)
    finally:
        if not conn.closed:
            conn.execute(q("replay_unlock_scratch_session"), {"key": REPLAY_LOCK_KEY})


def _swap(conn, schema: str, lock_timeout: float, give_up_after: float) -> SwapStats:
    names = _scratch_names(schema)
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
            stats = _swap_once(conn, names, meta["snapshot"], lock_timeout)
        except psycopg.errors.LockNotAvailable:
            if time.monotonic() >= deadline:
                raise ReplayError(f"could not lock the projections against writers within "
                                  f"{give_up_after:g} s ({attempt} tries)") from None
            time.sleep(random.uniform(0.05, 0.3) * min(attempt, 5))
            continue
        stats.attempts, stats.marked = attempt, marked
        return stats


def replay(conn, schema: str = SCRATCH_SCHEMA, *,
           progress: Progress | None = None) -> tuple[RebuildStats, SwapStats]:
    """`qforge replay`: rebuild the whole log, then swap the rebuild in."""
    built = rebuild(conn, schema, progress=progress)
    return built, swap(conn, schema)


def _mark_candidates(conn, names: dict[str, sql.Composable]) -> int:
    marked = 0
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(_template("replay_candidates_reset", candidates=names[CANDIDATES_TABLE]))
        for projection in PROJECTIONS:
            keys, others = _columns(cur, projection.table)
            cur.execute(_template(
                "replay_candidates_mark", candidates=names[CANDIDATES_TABLE],
                live=sql.Identifier(projection.table), scratch=names[projection.table],
                join=_join(keys), any_differs=_any_differs(others)))
            marked += cur.rowcount
    return marked


def _swap_once(conn, names: dict[str, sql.Composable], snapshot: str,
               lock_timeout: float) -> SwapStats:
    candidates = names[CANDIDATES_TABLE]
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("replay_lock_timeout"), {"timeout": f"{int(lock_timeout * 1000)}ms"})
        cur.execute(q("replay_lock_writers"))
        locked_at = time.monotonic()
        # Nothing can append now, and every writer that had begun has ended:
        # each statement from here on sees the whole log.
        cur.execute(q("replay_streams_since"), {"snapshot": snapshot})
        changed = [row["stream_id"] for row in cur.fetchall()]
        stats = SwapStats(refolded_streams=len(changed))
        if changed:
            params = {"lo": NIL_ID, "hi": None, "ids": changed, "as_of": None}
            for projection in PROJECTIONS:
                target = names[projection.table]
                cur.execute(_template("replay_forget", target=target), {"ids": changed})
                _insert_folded(cur, target, projection, params)
            cur.execute(_template("replay_candidates_add", candidates=candidates),
                        {"ids": changed})
        for projection in PROJECTIONS:
            _reconcile(cur, projection.table, names[projection.table], candidates, stats)
        cur.execute(_template("replay_scratch_meta_touch", meta=names[META_TABLE]))
        stats.lock_seconds = time.monotonic() - locked_at
    return stats


def _reconcile(cur, table: str, scratch: sql.Composable, candidates: sql.Composable,
               stats: SwapStats) -> None:
    """Delete, update and insert the candidate live rows that differ from the rebuild."""
    keys, others = _columns(cur, table)
    rebuilt = sql.Identifier("r")
    shared = {"live": sql.Identifier(table), "scratch": scratch, "candidates": candidates,
              "join": _join(keys)}
    cur.execute(_template("replay_swap_delete", **shared))
    stats.deleted[table] = cur.rowcount
    stats.updated[table] = 0
    if others:
        cur.execute(_template(
            "replay_swap_update", **shared, any_differs=_any_differs(others),
            assignments=sql.SQL(", ").join(
                sql.SQL("{} = {}").format(sql.Identifier(c), _col(rebuilt, c)) for c in others)))
        stats.updated[table] = cur.rowcount
    every = keys + others
    cur.execute(_template(
        "replay_swap_insert", **shared,
        columns=sql.SQL(", ").join(sql.Identifier(c) for c in every),
        scratch_columns=sql.SQL(", ").join(_col(rebuilt, c) for c in every)))
    stats.inserted[table] = cur.rowcount


def _read_meta(conn, schema: str, names: dict[str, sql.Composable]) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("replay_scratch_exists"), {"schema": schema, "table": META_TABLE})
        if not cur.fetchone()["present"]:
            raise ReplayError(f"no rebuild in schema {schema}: run rebuild() first")
        cur.execute(_template("replay_scratch_meta_read", meta=names[META_TABLE]))
        return cur.fetchone()


# ---------------------------------------------------------------------------
# shared


def _require_idle(conn) -> None:
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise ValueError("replay needs a connection that is not inside a transaction"
                         " (it sets the isolation level of its own)")


def _refuse_live_schema(cur, schema: str) -> None:
    """A rebuild drops and recreates its schema: never the one of the live tables."""
    cur.execute(q("replay_live_schema"))
    live = cur.fetchone()["schema"]
    if schema == live or schema.startswith("pg_") or schema == "information_schema":
        raise ReplayError(f"schema {schema} cannot be a scratch schema: a rebuild drops it"
                          f" (the live projections are in {live})")


def _scratch_names(schema: str) -> dict[str, sql.Composable]:
    tables = [p.table for p in PROJECTIONS] + [META_TABLE, CANDIDATES_TABLE]
    return {table: sql.Identifier(schema, table) for table in tables}


def _template(name: str, **parts: sql.Composable) -> sql.Composed:
    return sql.SQL(q(name)).format(**parts)


def _col(alias: sql.Identifier, column: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(alias, sql.Identifier(column))


def _any_differs(columns: list[str]) -> sql.Composable:
    if not columns:
        return sql.SQL("false")
    return sql.SQL(" OR ").join(
        sql.SQL("l.{} IS DISTINCT FROM r.{}").format(sql.Identifier(c), sql.Identifier(c))
        for c in columns)


def _join(keys: list[str]) -> sql.Composed:
    return sql.SQL(" AND ").join(
        sql.SQL("l.{} = r.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in keys)


def _columns(cur, table: str) -> tuple[list[str], list[str]]:
    """(primary key columns, other columns) of a live projection, from the catalog,
    so that a column added by a later migration is compared and swapped too."""
    cur.execute(q("replay_table_columns"), {"table": table})
    rows = cur.fetchall()
    keys = [row["name"] for row in rows if row["is_key"]]
    if "id" not in keys:
        raise ReplayError(f"projection {table} needs an id column in its primary key")
    return keys, [row["name"] for row in rows if not row["is_key"]]


def _insert_folded(cur, target: sql.Composable, projection: Projection,
                   params: dict[str, Any]) -> int:
    cur.execute(_template("replay_insert", target=target, fold=sql.SQL(q(projection.fold))),
                params, prepare=False)
    return cur.fetchone()["n"]


def _chunks(cur, size: int, total: int,
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


def _status_note(row: dict[str, Any] | None, prefix: str) -> str:
    if not row or "status" not in row:
        return ""
    return f" ({prefix}: status {_show(row['status'])})"


def _show(value: Any) -> str:
    return json.dumps(value, default=str, sort_keys=True)


# ---------------------------------------------------------------------------
# qforge replay


class ProgressPrinter:
    """Progress lines on stderr, at most one per `every` seconds, none for short runs."""

    def __init__(self, label: str, stream: TextIO = sys.stderr, every: float = 1.0):
        self.label, self.stream, self.every = label, stream, every
        self.started = self.last = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.started < self.every:
            return  # a short run needs no progress report
        if now - self.last < self.every and done < total:
            return
        self.last = now
        rate = done / (now - self.started) if now > self.started else 0.0
        share = 100 * done / total if total else 100
        print(f"{self.label}: {done:,} of {total:,} events ({share:.0f} %), {rate:,.0f} events/s",
              file=self.stream, flush=True)


def cli_main(args: argparse.Namespace) -> int:
    """`qforge replay [--verify] [--as-of POSITION | --as-of-time ISO]`.

    Exit 0: done (verify: no difference); 1: verify found differences; 2: the
    replay could not run.
    """
    from app.db import EmbeddedPostgresError, connect, resolve_database_url

    as_of, as_of_time = getattr(args, "as_of", None), getattr(args, "as_of_time", None)
    if args.verify and (as_of is not None or as_of_time is not None):
        print("qforge replay: --verify compares with the live tables, which hold the current"
              " state; it cannot be combined with --as-of", file=sys.stderr)
        return 2
    if as_of is not None and as_of < 0:
        print("qforge replay: --as-of must be a log position (0 or more)", file=sys.stderr)
        return 2
    try:
        url = resolve_database_url(getattr(args, "database_url", None))
        with connect(url, autocommit=True) as conn:
            if args.verify:
                return _cli_verify(conn)
            if as_of is not None or as_of_time is not None:
                return _cli_as_of(conn, as_of, as_of_time)
            return _cli_replay(conn)
    except (EmbeddedPostgresError, psycopg.Error, ReplayError) as exc:
        print(f"qforge replay: {exc}", file=sys.stderr)
        return 2


def _cli_verify(conn) -> int:
    report = verify_report(conn, progress=ProgressPrinter("verify"))
    for difference in report.differences:
        print(difference.describe())
    tables = sorted({d.table for d in report.differences})
    summary = (f"{report.events:,} events up to position {report.last_position} folded and"
               f" compared with the live jobs, workflows and execution_tags"
               f" in {report.seconds:.1f} s")
    if report.differences:
        print(f"{len(report.differences)} difference(s) in {', '.join(tables)}; {summary}")
        return 1
    print(f"no differences: {summary}")
    return 0


def _cli_as_of(conn, as_of: int | None, as_of_time: datetime | None) -> int:
    position = as_of if as_of is not None else position_at(conn, as_of_time)
    stats = rebuild(conn, SCRATCH_SCHEMA, position, progress=ProgressPrinter("replay"))
    moment = f" (time {as_of_time.isoformat()})" if as_of_time is not None else ""
    print(f"state as of position {position}{moment}: {stats.events:,} events folded in"
          f" {stats.seconds:.1f} s into schema {stats.schema}"
          f" (tables jobs, workflows, execution_tags; not swapped in)")
    for table, counts in status_counts(conn, SCRATCH_SCHEMA).items():
        shown = ", ".join(f"{status} {n}" for status, n in counts.items()) or "none"
        print(f"  {table}: {sum(counts.values())} ({shown})")
    return 0


def _cli_replay(conn) -> int:
    built, swapped = replay(conn, SCRATCH_SCHEMA, progress=ProgressPrinter("replay"))
    print(f"rebuilt {built.events:,} events up to position {built.last_position} in"
          f" {built.seconds:.1f} s ({built.events_per_second:,.0f} events/s) into schema"
          f" {built.schema}")
    changes = ", ".join(
        f"{table} {swapped.updated[table]} updated, {swapped.inserted[table]} inserted,"
        f" {swapped.deleted[table]} deleted" for table in swapped.updated)
    print(f"swapped in atomically: {swapped.changed} rows changed ({changes});"
          f" {swapped.marked} rows differed before the locks, {swapped.refolded_streams} streams"
          f" got events meanwhile and were folded again; writers waited {swapped.lock_seconds:.2f} s")
    return 0
