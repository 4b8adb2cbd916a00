"""Replay benchmark: 1,000,000 events in a fresh database, then rebuild (median of 3), verify and swap.

    python bench/replay_bench.py [--server-url postgresql://postgres@127.0.0.1:5432/postgres]

Creates (and drops, unless --keep) the database qf_bench_replay on that
server, migrates it, appends Enqueued/Claimed/Succeeded for 333,334 jobs
through the live projection trigger, then times the replay. Also times the
bare jobs fold with the first table-lookup state_next (a query per event)
against the current one (the state_machine() jsonb constant).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from qforge.db import connect, with_database  # noqa: E402
from qforge.migrate import migrate  # noqa: E402
from qforge.projections import replay  # noqa: E402
from qforge.sql import q  # noqa: E402

DATABASE = "qf_bench_replay"
BATCH_JOBS = 50_000
_HEADER = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*-*\s*$", re.MULTILINE)


def load_queries() -> dict[str, str]:
    text = (Path(__file__).parent / "replay_bench.sql").read_text()
    marks = list(_HEADER.finditer(text))
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return {m.group(1): text[m.end():end].strip() for m, end in zip(marks, ends)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=333_334,
                        help="3 events each (default: 1,000,002 events)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--database", default=DATABASE,
                        help=f"name of the scratch database (default {DATABASE})")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()
    queries = load_queries()
    url = with_database(args.server_url, args.database)
    database = sql.Identifier(args.database)
    with connect(args.server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(database))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(database))
    try:
        with connect(url, autocommit=True) as conn:
            migrate(conn)
            version = conn.execute("SHOW server_version").fetchone()[0]
            print(f"server: PostgreSQL {version}, database {args.database}")
            started = time.monotonic()
            for name in ("bench_enqueued", "bench_claimed", "bench_succeeded"):
                for first in range(0, args.jobs, BATCH_JOBS):
                    conn.execute(queries[name], {"first": first,
                                                 "last": min(first + BATCH_JOBS, args.jobs) - 1})
            appended = time.monotonic() - started
            conn.execute("VACUUM ANALYZE events")
            conn.execute("VACUUM ANALYZE jobs")
            events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
            print(f"appended {events:,} events through the live projection trigger in {appended:.1f} s"
                  f" ({events / appended:,.0f} events/s)")

            backend = conn.info.backend_pid
            runs, cpu = [], []
            for run in range(args.runs):
                cpu_before = backend_cpu_seconds(backend)
                stats = replay.rebuild(conn)
                runs.append(stats.seconds)
                cpu.append(backend_cpu_seconds(backend) - cpu_before)
                print(f"  rebuild run {run + 1}: {stats.seconds:.2f} s"
                      f" ({stats.events_per_second:,.0f} events/s),"
                      f" server CPU {cpu[-1]:.2f} s, rows {stats.rows}")
            median = statistics.median(runs)
            print(f"rebuild (median of {args.runs}): {median:.2f} s = {events / median:,.0f} events/s"
                  f" (per server CPU second: {events / statistics.median(cpu):,.0f} events)")

            report = replay.verify_report(conn)
            print(f"verify: {report.seconds:.2f} s = {events / report.seconds:,.0f} events/s,"
                  f" {len(report.differences)} differences")
            started = time.monotonic()
            swapped = replay.swap(conn)
            print(f"swap: {time.monotonic() - started:.2f} s, writers locked out"
                  f" {swapped.lock_seconds * 1000:.0f} ms, {swapped.changed} rows changed")

            current = _time_fold(conn, queries)
            lookup = (0.0, 0.0)
            with conn.transaction():  # the old function only for this transaction
                conn.execute(queries["bench_state_next_lookup"])
                lookup = _time_fold(conn, queries)
                raise psycopg.Rollback()
            for name, (wall, cpu_seconds) in (("table-lookup state_next (first version)", lookup),
                                              ("current state_next", current)):
                print(f"bare jobs fold in one statement, {name}: {wall:.2f} s = {events / wall:,.0f}"
                      f" events/s, server CPU {cpu_seconds:.2f} s")
        return 0 if report.differences == [] else 1
    finally:
        if not args.keep:
            with connect(args.server_url, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(database))


def backend_cpu_seconds(pid: int) -> float:
    """CPU time of the server process serving us (when the server runs on this machine), else 0."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _time_fold(conn, queries: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, server CPU seconds) of the bare jobs fold."""
    with conn.transaction():
        conn.execute(q("replay_work_mem"))
        started, cpu_before = time.monotonic(), backend_cpu_seconds(conn.info.backend_pid)
        conn.execute(queries["bench_fold_all"]).fetchone()
        return time.monotonic() - started, backend_cpu_seconds(conn.info.backend_pid) - cpu_before


if __name__ == "__main__":
    sys.exit(main())
