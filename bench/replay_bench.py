"""Replay benchmark: 1,000,000 events; today's rebuild against 0.1.0's, in one run; then verify and swap.

    python bench/replay_bench.py [--server-url postgresql://postgres@127.0.0.1:5432/postgres]

Makes the database qf_bench_replay_v010 with the 0.1.0 release (its schema and
code, tests/fixtures/qforge-0.1.0) and appends Enqueued/Claimed/Succeeded for
333,334 jobs through its live projection trigger. Then, interleaved, `--runs`
times each: 0.1.0's rebuild (its row-by-row fold aggregated per stream, run by
the 0.1.0 code in a subprocess) on that database, and today's rebuild (the
set-based fold of the live path, fed the log in position order) on a copy
upgraded by today's `qforge migrate` — the same events. Drops both databases
unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from psycopg import sql  # noqa: E402

from common import recreate  # noqa: E402
from qforge.db import connect, with_database  # noqa: E402
from qforge.migrate import migrate  # noqa: E402
from qforge.cli.replay import FOLDERS  # noqa: E402
from qforge.projections import replay  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "qforge-0.1.0"
OLD, NEW = "qf_bench_replay_v010", "qf_bench_replay"
BATCH_JOBS = 50_000
_HEADER = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*-*\s*$", re.MULTILINE)

# Run with the 0.1.0 package (named `app`) on the path: migrate, append, or rebuild.
OLD_DRIVER = r"""
import json, sys, time
import psycopg
from app.migrate import migrate
from app.projections import replay
command, url = sys.argv[1], sys.argv[2]
with psycopg.connect(url, autocommit=True) as conn:
    if command == "migrate":
        migrate(conn, sys.argv[3], sync_state_machine=True)
    elif command == "append":
        queries = json.loads(sys.argv[3]); jobs = int(sys.argv[4]); batch = int(sys.argv[5])
        for name in ("bench_enqueued", "bench_claimed", "bench_succeeded"):
            for first in range(0, jobs, batch):
                conn.execute(queries[name], {"first": first, "last": min(first + batch, jobs) - 1})
        conn.execute("VACUUM ANALYZE events"); conn.execute("VACUUM ANALYZE jobs")
    else:
        stats = replay.rebuild(conn)
        print(json.dumps({"seconds": stats.seconds, "events": stats.events}))
"""


def load_queries() -> dict[str, str]:
    text = (Path(__file__).parent / "replay_bench.sql").read_text()
    marks = list(_HEADER.finditer(text))
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return {m.group(1): text[m.end():end].strip() for m, end in zip(marks, ends)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=333_334, help="3 events each (default: 1,000,002 events)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the databases afterwards")
    args = parser.parse_args()
    old_url, new_url = with_database(args.server_url, OLD), with_database(args.server_url, NEW)
    with tempfile.TemporaryDirectory(prefix="qforge-0.1.0-") as release:
        with zipfile.ZipFile(FIXTURE / "app.zip") as archive:
            archive.extractall(release)

        def old(*argv: str) -> str:
            env = {**os.environ, "PYTHONPATH": release}
            return subprocess.run([sys.executable, "-c", OLD_DRIVER, *argv], cwd=release, env=env,
                                  check=True, capture_output=True, text=True).stdout

        recreate(args.server_url, OLD)
        try:
            started = time.monotonic()
            old("migrate", old_url, str(Path(release) / "schema"))
            old("append", old_url, json.dumps(load_queries()), str(args.jobs), str(BATCH_JOBS))
            print(f"0.1.0 database: {3 * args.jobs:,} events appended through its projection trigger in"
                  f" {time.monotonic() - started:.1f} s")
            recreate(args.server_url, NEW, template=OLD)
            with connect(new_url, autocommit=True) as conn:
                started = time.monotonic()
                migrate(conn)
                print(f"upgraded a copy to today's schema in {time.monotonic() - started:.1f} s")
                conn.execute("VACUUM ANALYZE jobs")
                events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
                new_runs, old_runs = [], []
                for run in range(args.runs):  # interleaved: a noisy moment hits both
                    found = json.loads(old("rebuild", old_url))
                    old_runs.append(found["events"] / found["seconds"])
                    print(f"  0.1.0 rebuild run {run + 1}: {found['seconds']:.2f} s ({old_runs[-1]:,.0f} events/s)")
                    stats = replay.rebuild(conn, url=new_url, parallel=FOLDERS)
                    new_runs.append(stats.events_per_second)
                    print(f"  rebuild run {run + 1}: {stats.seconds:.2f} s ({stats.events_per_second:,.0f} events/s)")
                report = replay.verify_report(conn)
                print(f"verify: {report.seconds:.2f} s = {events / report.seconds:,.0f} events/s,"
                      f" {len(report.differences)} differences")
                started = time.monotonic()
                swapped = replay.swap(conn)
                print(f"swap: {time.monotonic() - started:.2f} s, writers locked out"
                      f" {swapped.lock_seconds * 1000:.0f} ms, {swapped.changed} rows changed")
            result = {"events": events, "events_per_s": statistics.median(new_runs),
                      "v010_events_per_s": statistics.median(old_runs),
                      "ratio": statistics.median(new_runs) / statistics.median(old_runs),
                      "runs": new_runs, "v010_runs": old_runs,
                      "verify_events_per_s": events / report.seconds, "swap_lock_ms": swapped.lock_seconds * 1000}
            print(f"rebuild (median of {args.runs}): today {result['events_per_s']:,.0f} events/s, 0.1.0"
                  f" {result['v010_events_per_s']:,.0f} events/s: {result['ratio']:.2f}x")
            print("RESULT " + json.dumps(result))
            return 0 if not report.differences else 1
        finally:
            if not args.keep:
                for name in (NEW, OLD):
                    drop(args.server_url, name)


def drop(server_url: str, name: str) -> None:
    with connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


if __name__ == "__main__":
    sys.exit(main())
