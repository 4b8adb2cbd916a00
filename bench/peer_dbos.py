"""DBOS Transact 3.x driver for run.py, run inside bench/.peers-venv: each job is a one-step-less
workflow on a DBOS queue, in the system database DBOS keeps in the benchmark's database.

    setup    --url U                        launch DBOS once: it creates its `dbos` schema
    enqueue  --url U --jobs N --batch B     DBOSClient.enqueue_in_transaction, one call per job,
                                            B per transaction (DBOS has no batch enqueue); RESULT jobs/s
    worker   --url U --concurrency 100 --polling-interval 0.05 --latency-dir D
                                            a launched DBOS process serving queue "bench" until SIGTERM
    latency  --url U --jobs N --interval S  DBOSClient.enqueue one job at a time, enqueue time in the args

Settings, and why: DBOS finds queued work only by polling (no LISTEN/NOTIFY for queues; its
default interval is 1 s, which alone would put its latency p50 near 500 ms). Each poll of a
worker claims up to `worker_concurrency` minus its running workflows, so a process drains at most
worker_concurrency / polling_interval jobs per second, and waits on average half an interval for
a new job. worker_concurrency=100 (the limit Oban's queue gets here, and the order of PgQueuer's
batch of 100) and polling_interval_sec=0.05 (20 polls a second per process: a new job waits 25 ms
on average; at the 0.1 s that bench/code_vs_dbos.py uses it waits 50 ms and the drain is capped at
2,000 jobs/s for two processes; below 0.05 s the idle polling itself becomes a steady load on
PostgreSQL that no other peer pays). Sync workflows run on DBOS's thread pool, as a DBOS
application's do.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import sqlalchemy as sa
from dbos import DBOS, DBOSClient, DBOSConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import batch_sizes, driver_main, emit, emit_rate, record_start  # noqa: E402

QUEUE = "bench"
LATENCY_DIR = os.environ.get("BENCH_LATENCY_DIR", "/tmp")


@DBOS.workflow(name="noop")
def noop() -> None:
    pass


@DBOS.workflow(name="latency")
def latency_workflow(enqueued_at: float) -> None:
    record_start(LATENCY_DIR, enqueued_at)


def launch(url: str) -> None:
    config: DBOSConfig = {"name": "qf_bench", "system_database_url": url, "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()


def setup(args) -> None:
    launch(args.url)
    DBOS.destroy()


def enqueue(args) -> None:
    client = DBOSClient(system_database_url=args.url)
    engine = sa.create_engine(args.url.replace("postgresql://", "postgresql+psycopg://", 1))
    options = {"queue_name": QUEUE, "workflow_name": "noop"}
    started = time.perf_counter()
    for size in batch_sizes(args.jobs, args.batch):
        with engine.begin() as conn:
            for _ in range(size):
                client.enqueue_in_transaction(conn, options)
    emit_rate(args.jobs, started)
    engine.dispose()
    client.destroy()


def worker(args) -> None:
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    launch(args.url)
    DBOS.register_queue(QUEUE, worker_concurrency=args.concurrency, polling_interval_sec=args.polling_interval)
    print("READY", file=sys.stderr, flush=True)
    stopping.wait()
    DBOS.destroy()


def latency(args) -> None:
    client = DBOSClient(system_database_url=args.url)
    options = {"queue_name": QUEUE, "workflow_name": "latency"}
    for _ in range(args.jobs):
        client.enqueue(options, time.time())
        time.sleep(args.interval)
    client.destroy()
    emit({"sent": args.jobs})


def main() -> None:
    driver_main(globals(), concurrency=100, polling_interval=0.05)


if __name__ == "__main__":
    main()
