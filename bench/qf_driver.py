"""QForge driver for run.py, run in the project's venv; the same verbs as the peers' drivers.

    setup    --url U                        apply the migrations
    enqueue  --url U --jobs N --batch B     enqueue N no-op jobs in batches (qforge.commands.enqueue.enqueue_many,
                                            as PgQueuer's Queries.enqueue takes lists); RESULT jobs/s
    latency  --url U --jobs N --interval S  enqueue N jobs one at a time, enqueue time in the payload
    worker   --url U --batch B              fallback drain loop (claim + complete), used only when
                                            app/workers/worker.py does not exist
"""

from __future__ import annotations

import os
import signal
import sys
import time

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import batch_sizes, driver_main, emit, emit_rate  # noqa: E402

from qforge.commands.enqueue import JobSpec, enqueue as enqueue_jobs, enqueue_many


def setup(args) -> None:
    from qforge.migrate import migrate

    with psycopg.connect(args.url, autocommit=True) as conn:
        migrate(conn)


def enqueue(args) -> None:
    with psycopg.connect(args.url, autocommit=True) as conn:
        started = time.perf_counter()
        for size in batch_sizes(args.jobs, args.batch):
            enqueue_many(conn, "bench_noop", [None] * size, actor="bench")
        emit_rate(args.jobs, started)


def latency(args) -> None:
    with psycopg.connect(args.url, autocommit=True) as conn:
        for _ in range(args.jobs):
            enqueue_jobs(conn, [JobSpec(task="bench_latency", payload={"enqueued_at": time.time()})],
                         actor="bench")
            time.sleep(args.interval)
    emit({"sent": args.jobs})


def worker(args) -> None:
    """Claim a batch, 'run' it (no-op), complete it in one statement; until SIGTERM."""
    from qforge.commands.claim import claim
    from qforge.commands.report import Report, complete

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    name = f"bench-loop-{os.getpid()}"
    print("READY", file=sys.stderr, flush=True)
    with psycopg.connect(args.url, autocommit=True) as conn:
        while not stop:
            jobs = claim(conn, ["default"], args.batch, name)
            if not jobs:
                time.sleep(0.01)
                continue
            complete(conn, [Report(j.id, j.attempt, result=None) for j in jobs], actor=name,
                     workflow_ids_known=True)


def main() -> None:
    driver_main(globals())


if __name__ == "__main__":
    main()
