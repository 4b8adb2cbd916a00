"""QForge only: PostgreSQL CPU per job of enqueue, claim and complete under variants of the projection.

    python bench/qf_variants.py --database-url postgresql://postgres@127.0.0.1:5432/postgres

Evidence for proposals, not a figure of run.py. Each variant runs on a fresh
database cloned from a migrated template, in one connection, through the real
commands (app.commands.enqueue / claim / report.complete); the figure is the
CPU time of that connection's server process (/proc/<pid>/schedstat, so it
needs PostgreSQL on this machine), which a noisy neighbour disturbs far less
than wall time. Prototypes live in bench/qf_variants.sql.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from qforge.commands.claim import claim  # noqa: E402
from qforge.commands.enqueue import JobSpec, enqueue  # noqa: E402
from qforge.migrate import migrate  # noqa: E402
from qforge.sql import q  # noqa: E402
from common import load_queries  # noqa: E402

TEMPLATE = "qf_bench_variants_tpl"
SCRATCH = "qf_bench_variants"

VARIANTS = {
    "current schema": [],
    "set-based projection (prototype)": ["bench_use_set_based"],
}


def with_database(url: str, name: str) -> str:
    from qforge.db import with_database as swap

    return swap(url, name)


def recreate(admin_url: str, name: str, template: str | None = None) -> str:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if template:
            admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name),
                                                                          sql.Identifier(template)))
        else:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_database(admin_url, name)


def server_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as stat:
        return int(stat.read().split()[0])


def measure(url: str, statements: list[str], queries: dict[str, str], jobs: int, batch: int,
            check: bool) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        for name in statements:
            conn.execute(queries[name])
        pid = conn.info.backend_pid
        started, wall = server_ns(pid), time.perf_counter()
        for first in range(0, jobs, 1000):
            enqueue(conn, [JobSpec(task="bench_noop") for _ in range(min(1000, jobs - first))], actor="bench")
        enqueue_ns, enqueue_wall = server_ns(pid) - started, time.perf_counter() - wall
        conn.execute("ANALYZE jobs")
        claim_ns = complete_ns = done = 0
        drain_wall = 0.0
        while True:
            started, wall = server_ns(pid), time.perf_counter()
            claimed = claim(conn, ["default"], batch, "bench")  # as a worker claims (statement and plan)
            claim_ns += server_ns(pid) - started
            if not claimed:
                break
            reports = json.dumps([{"id": str(job.id), "attempt": job.attempt, "result": None} for job in claimed])
            started = server_ns(pid)
            with conn.transaction():
                conn.execute(q("job_complete"), {"reports": reports, "actor": "bench", "now": None}).fetchall()
            complete_ns += server_ns(pid) - started
            drain_wall += time.perf_counter() - wall
            done += len(claimed)
        if done != jobs:
            raise RuntimeError(f"drained {done} of {jobs} jobs")
        unlike = conn.execute(queries["bench_rows_unlike_fold"]).fetchone()[0] if check else 0
        if unlike:
            raise RuntimeError(f"{unlike} rows differ from the fold of their events")
    # also the wall time per job, client included (one connection, nothing in parallel): what a user's
    # enqueue or a worker's claim and report cost end to end
    return {"enqueue": enqueue_ns / 1e3 / jobs, "claim": claim_ns / 1e3 / jobs, "complete": complete_ns / 1e3 / jobs,
            "enqueue_wall": enqueue_wall * 1e6 / jobs, "drain_wall": drain_wall * 1e6 / jobs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--batch", type=int, default=500, help="claim/complete batch (the worker's concurrency)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    queries = load_queries(str(ROOT / "bench" / "qf_variants.sql"))
    template_url = recreate(args.database_url, TEMPLATE)
    with psycopg.connect(template_url, autocommit=True) as conn:
        migrate(conn)
        conn.execute(queries["bench_projection_set_based"])
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    try:
        for rep in range(args.repeat):
            for name, statements in VARIANTS.items():  # interleaved: noise spreads over all variants
                url = recreate(args.database_url, SCRATCH, TEMPLATE)
                figures[name].append(measure(url, statements, queries, args.jobs, args.batch, check=rep == 0))
    finally:
        with psycopg.connect(args.database_url, autocommit=True) as admin:
            for name in (SCRATCH, TEMPLATE):
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    print(f"PostgreSQL CPU µs per job (median of {args.repeat}; {args.jobs:,} jobs, enqueue batches of 1,000,"
          f" claim/complete batches of {args.batch}); every row checked against job_fold")
    print("| variant | enqueue | claim | complete | claim + complete |")
    print("| --- | --- | --- | --- | --- |")
    for name, runs in figures.items():
        median = {key: statistics.median(run[key] for run in runs) for key in ("enqueue", "claim", "complete")}
        print(f"| {name} | {median['enqueue']:.1f} | {median['claim']:.1f} | {median['complete']:.1f} |"
              f" {median['claim'] + median['complete']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
