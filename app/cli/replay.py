"""`qforge replay [--verify] [--archive DIR] [--as-of POSITION | --as-of-time ISO]`: rebuild, verify or look back."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime

import psycopg

from qforge.cli.common import session_url
from qforge.cli.progress import Progress
from qforge.db import EmbeddedPostgresError, connect, resolve_database_url
from qforge.projections.replay import (SCRATCH_SCHEMA, ReplayError, position_at, rebuild, replay,
                                       status_counts, verify_report)

# Connections that fold at once: the streams are independent and a rebuild is CPU-bound in
# the database, so one per core (of this machine: the usual case is a database beside it).
FOLDERS = max(1, min(4, os.cpu_count() or 1))


def run(args: argparse.Namespace) -> int:
    """`qforge replay [--verify] [--as-of POSITION | --as-of-time ISO]`.

    Exit 0: done (verify: no difference); 1: verify found differences; 2: the
    replay could not run.
    """
    as_of, as_of_time = getattr(args, "as_of", None), getattr(args, "as_of_time", None)
    if args.verify and (as_of is not None or as_of_time is not None):
        print("qforge replay: --verify compares with the live tables, which hold the current"
              " state; it cannot be combined with --as-of", file=sys.stderr)
        return 2
    if as_of is not None and as_of < 0:
        print("qforge replay: --as-of must be a log position (0 or more)", file=sys.stderr)
        return 2
    try:
        url = session_url("replay", resolve_database_url(getattr(args, "database_url", None)))
        if url is None:
            return 2
        archive = getattr(args, "archive", None)
        if archive is not None and not archive.is_dir():
            print(f"qforge replay: {archive} is not a directory", file=sys.stderr)
            return 2
        with connect(url, autocommit=True) as conn:
            if args.verify:
                return _cli_verify(conn, archive)
            if as_of is not None or as_of_time is not None:
                return _cli_as_of(conn, as_of, as_of_time, url, archive)
            return _cli_replay(conn, url, archive)
    except (EmbeddedPostgresError, psycopg.Error, ReplayError) as exc:
        print(f"qforge replay: {exc}", file=sys.stderr)
        return 2


def _cli_verify(conn, archive) -> int:
    with Progress("verify", unit="events") as progress:
        report = verify_report(conn, progress=progress, archive=archive)
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


def _cli_as_of(conn, as_of: int | None, as_of_time: datetime | None, url: str, archive) -> int:
    position = as_of if as_of is not None else position_at(conn, as_of_time)
    with Progress("replay", unit="events") as progress:
        stats = rebuild(conn, SCRATCH_SCHEMA, position, progress=progress, url=url, parallel=FOLDERS,
                        archive=archive)
    moment = f" (time {as_of_time.isoformat()})" if as_of_time is not None else ""
    print(f"state as of position {position}{moment}: {stats.events:,} events folded in"
          f" {stats.seconds:.1f} s into schema {stats.schema}"
          f" (tables jobs, workflows, execution_tags; not swapped in)")
    for table, counts in status_counts(conn, SCRATCH_SCHEMA).items():
        shown = ", ".join(f"{status} {n}" for status, n in counts.items()) or "none"
        print(f"  {table}: {sum(counts.values())} ({shown})")
    return 0


def _cli_replay(conn, url: str, archive) -> int:
    with Progress("replay", unit="events") as progress:
        built, swapped = replay(conn, SCRATCH_SCHEMA, progress=progress, url=url, parallel=FOLDERS,
                                archive=archive)
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
