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
from common import in_turns, load_queries, recreate  # noqa: E402

TEMPLATE = "qf_bench_variants_tpl"
SCRATCH = "qf_bench_variants"

VARIANTS = {
    "current schema": [],
    "set-based projection (prototype)": ["bench_use_set_based"],
}


def with_database(url: str, name: str) -> str:
    from qforge.db import with_database as swap

    return swap(url, name)


def server_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as stat:
        return int(stat.read().split()[0])


class Run:
    """One variant's database and connection, stepped batch by batch (so that several runs can take
    turns), adding up its server process's CPU time and the wall time per step, client included."""

    def __init__(self, url: str, statements: list[str], queries: dict[str, str]) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        for name in statements:
            self.conn.execute(queries[name])
        self.pid = self.conn.info.backend_pid
        self.ns = {"enqueue": 0, "claim": 0, "complete": 0}
        self.wall = {"enqueue": 0.0, "drain": 0.0}
        self.enqueued = self.done = 0

    def enqueue(self, n: int) -> None:
        started, wall = server_ns(self.pid), time.perf_counter()
        enqueue(self.conn, [JobSpec(task="bench_noop") for _ in range(n)], actor="bench")
        self.ns["enqueue"] += server_ns(self.pid) - started
        self.wall["enqueue"] += time.perf_counter() - wall
        self.enqueued += n

    def drain(self, batch: int) -> int:
        """Claim up to `batch` jobs as a worker claims (statement and plan) and complete them."""
        started, wall = server_ns(self.pid), time.perf_counter()
        claimed = claim(self.conn, ["default"], batch, "bench")
        self.ns["claim"] += server_ns(self.pid) - started
        if claimed:
            reports = json.dumps([{"id": str(job.id), "attempt": job.attempt, "result": None} for job in claimed])
            started = server_ns(self.pid)
            with self.conn.transaction():
                self.conn.execute(q("job_complete"), {"reports": reports, "actor": "bench", "now": None}).fetchall()
            self.ns["complete"] += server_ns(self.pid) - started
            self.done += len(claimed)
        self.wall["drain"] += time.perf_counter() - wall
        return len(claimed)

    def figures(self) -> dict[str, float]:
        """µs per job: PostgreSQL CPU per step, and the wall time of enqueue and of claim + complete."""
        if self.done != self.enqueued:
            raise RuntimeError(f"drained {self.done} of {self.enqueued} jobs")
        jobs = self.enqueued
        return {**{step: ns / 1e3 / jobs for step, ns in self.ns.items()},
                "enqueue_wall": self.wall["enqueue"] * 1e6 / jobs, "drain_wall": self.wall["drain"] * 1e6 / jobs}

    def close(self) -> None:
        self.conn.close()


def measure_side_by_side(runs: list[Run], jobs: int, batch: int) -> None:
    """Every run enqueues `jobs` and drains them, taking turns batch by batch (the first of each turn
    alternating), so that a noisy neighbour's bursts fall on all of them alike."""
    for turn, first in enumerate(range(0, jobs, 1000)):
        for run in in_turns(runs, turn):
            run.enqueue(min(1000, jobs - first))
    for run in runs:
        run.conn.execute("ANALYZE jobs")
    active, turn = list(runs), 0
    while active:
        for run in in_turns(active, turn):
            if not run.drain(batch):
                active.remove(run)
        turn += 1


def measure(url: str, statements: list[str], queries: dict[str, str], jobs: int, batch: int,
            check: bool) -> dict[str, float]:
    run = Run(url, statements, queries)
    try:
        measure_side_by_side([run], jobs, batch)
        unlike = run.conn.execute(queries["bench_rows_unlike_fold"]).fetchone()[0] if check else 0
        if unlike:
            raise RuntimeError(f"{unlike} rows differ from the fold of their events")
        return run.figures()
    finally:
        run.close()


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
