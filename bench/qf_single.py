"""One-job enqueues, one after the other: PostgreSQL CPU and wall time per job, as one statement
on its own and inside BEGIN ... COMMIT.

    python bench/qf_single.py --database-url postgresql://postgres@127.0.0.1:5432/postgres

A one-job enqueue without idempotency key is a plan of one statement, which an autocommit
connection runs without BEGIN and COMMIT (qforge.commands.plan.Last); this prices that against
the transaction of its own the plan would otherwise get. Both ways run in turns, in blocks of
`--block` jobs, on one fresh migrated database; the CPU is the connection's server process's
(/proc/<pid>/schedstat, so PostgreSQL must run on this machine).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

import qforge.commands.plan as plan  # noqa: E402
from qforge.commands.enqueue import JobSpec, enqueue  # noqa: E402
from qforge.migrate import migrate  # noqa: E402
from common import recreate  # noqa: E402
from side_by_side import server_ns  # noqa: E402

ALONE = plan._alone
WAYS = {"one statement alone": ALONE, "in BEGIN ... COMMIT": lambda conn, batch: False}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--blocks", type=int, default=20, help="blocks per way, taken in turns")
    parser.add_argument("--block", type=int, default=100, help="one-job enqueues per block")
    parser.add_argument("--db-name", default="qf_bench_single")
    args = parser.parse_args()
    url = recreate(args.database_url, args.db_name)
    cpu: dict[str, list[float]] = {way: [] for way in WAYS}
    wall: dict[str, list[float]] = {way: [] for way in WAYS}
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
            for _ in range(50):  # plans prepared, caches warm
                enqueue(conn, [JobSpec(task="bench_noop")], actor="bench")
            pid = conn.info.backend_pid
            for turn in range(args.blocks):
                ways = list(WAYS.items())
                for way, alone in (ways if turn % 2 == 0 else ways[::-1]):
                    plan._alone = alone
                    started, clock = server_ns(pid), time.perf_counter()
                    for _ in range(args.block):
                        enqueue(conn, [JobSpec(task="bench_noop", payload={"n": 1})], actor="bench")
                    cpu[way].append((server_ns(pid) - started) / 1e3 / args.block)
                    wall[way].append((time.perf_counter() - clock) * 1e6 / args.block)
    finally:
        plan._alone = ALONE
        with psycopg.connect(args.database_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.db_name)))
    print(f"one-job enqueues, median of {args.blocks} blocks of {args.block} per way")
    print("| way | PostgreSQL CPU µs per job | wall µs per job |")
    print("| --- | --- | --- |")
    for way in WAYS:
        print(f"| {way} | {statistics.median(cpu[way]):.0f} | {statistics.median(wall[way]):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
