"""The audit's cost: PostgreSQL CPU per job with and without the event hash, checkpoint and verify speed.

    python bench/qf_audit.py --database-url postgresql://postgres@127.0.0.1:5432/postgres

Hashing: enqueue, claim and complete through the real commands on two fresh
databases cloned from one migrated template, one with the schema as it is and
one with event_hash replaced by a constant (bench/qf_audit.sql), taking turns
batch by batch (side_by_side.measure_side_by_side: on a shared machine the
neighbours' bursts last seconds, and runs taken one after the other differed by
up to 1.5x either way); the figures are the CPU time of each connection's
server process (/proc/<pid>/schedstat, so PostgreSQL must run on this machine)
and the wall time with the client. Then, on the last repetition's database with
the hash chain (a drained log):
the wall time of `audit.checkpoint` and of `audit_verify.verify` over the whole
log, in events per second.
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

from qforge.audit import checkpoints as audit  # noqa: E402
from qforge.audit import verify as audit_verify  # noqa: E402
from qforge.migrate import migrate  # noqa: E402
from common import load_queries, recreate, with_database  # noqa: E402
from side_by_side import Run, measure_side_by_side  # noqa: E402

VARIANTS = {"with the hash chain": [], "without (constant hash)": ["bench_without_hash", "bench_without_hash_fixed"]}
STEPS = ("enqueue", "claim", "complete", "enqueue_wall", "drain_wall")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--batch", type=int, default=500, help="claim/complete batch (the worker's concurrency)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--db-prefix", default="qf_bench_audit", help="scratch databases: PREFIX_tpl, PREFIX_0, PREFIX_1")
    args = parser.parse_args()
    queries = load_queries(str(ROOT / "bench" / "qf_audit.sql"))
    template, scratch = f"{args.db_prefix}_tpl", args.db_prefix
    with psycopg.connect(recreate(args.database_url, template), autocommit=True) as conn:
        migrate(conn)
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    try:
        for _ in range(args.repeat):
            runs = {name: Run(recreate(args.database_url, f"{scratch}_{n}", template), statements, queries)
                    for n, (name, statements) in enumerate(VARIANTS.items())}
            try:
                measure_side_by_side(list(runs.values()), args.jobs, args.batch)
                for name, run in runs.items():
                    figures[name].append(run.figures())
            finally:
                for run in runs.values():
                    run.close()
        # the last repetition's database with the hash chain: a drained log
        url = with_database(args.database_url, f"{scratch}_0")
        with psycopg.connect(url, autocommit=True) as conn:
            events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
            started = time.perf_counter()
            made = audit.checkpoint(conn)
            checkpoint_seconds = time.perf_counter() - started
            report = audit_verify.verify(conn)
            if report.problems:
                raise RuntimeError(f"verify found {len(report.problems)} problems in an untouched log")
    finally:
        with psycopg.connect(args.database_url, autocommit=True) as admin:
            for name in (*(f"{scratch}_{n}" for n in range(len(VARIANTS))), template):
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    print(f"PostgreSQL CPU µs per job (median of {args.repeat}; {args.jobs:,} jobs, enqueue batches of 1,000,"
          f" claim/complete batches of {args.batch})")
    print("| variant | enqueue | claim | complete | claim + complete |")
    print("| --- | --- | --- | --- | --- |")
    medians = {}
    for name, runs in figures.items():
        medians[name] = {key: statistics.median(run[key] for run in runs) for key in STEPS}
        m = medians[name]
        print(f"| {name} | {m['enqueue']:.1f} | {m['claim']:.1f} | {m['complete']:.1f} |"
              f" {m['claim'] + m['complete']:.1f} |")
    hashed, plain = medians.values()
    print(f"throughput with / without the hash (inverse ratio of PostgreSQL CPU): enqueue"
          f" {plain['enqueue'] / hashed['enqueue']:.3f}x, drain (claim + complete)"
          f" {(plain['claim'] + plain['complete']) / (hashed['claim'] + hashed['complete']):.3f}x")
    print(f"jobs/s end to end on one connection, client included, with / without: enqueue"
          f" {1e6 / hashed['enqueue_wall']:,.0f} / {1e6 / plain['enqueue_wall']:,.0f}"
          f" = {plain['enqueue_wall'] / hashed['enqueue_wall']:.3f}x, claim + complete"
          f" {1e6 / hashed['drain_wall']:,.0f} / {1e6 / plain['drain_wall']:,.0f}"
          f" = {plain['drain_wall'] / hashed['drain_wall']:.3f}x")
    print(f"checkpoint: {events:,} events in {len(made)} checkpoint(s), {checkpoint_seconds:.2f} s"
          f" ({events / checkpoint_seconds:,.0f} events/s)")
    print(f"verify: {report.events:,} events, {report.checkpoints} checkpoint(s) in {report.seconds:.2f} s"
          f" ({report.events_per_second:,.0f} events/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
