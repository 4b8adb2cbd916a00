"""Oban for Python driver for run.py, run inside bench/.oban-venv (Python 3.12+, psycopg 3 pool).

    setup    --url U                        install Oban's schema (oban.schema.install_sql)
    enqueue  --url U --jobs N --batch B     enqueue_many N no-op jobs in batches; RESULT jobs/s
    worker   --url U --limit 100 --latency-dir D
                                            an Oban instance running queue "default" until SIGTERM
    latency  --url U --jobs N --interval S  enqueue N jobs one at a time, enqueue time in the args

Settings: queue "default" with a limit of 100 jobs at once per process (Oban's producer fetches
up to its free slots in one statement, as PgQueuer's batch of 100 does); everything else is
Oban's default: an insert notifies the queue (LISTEN/NOTIFY), the stager's 1 s poll is only the
fallback, completed jobs are acknowledged in batches. Oban runs on asyncio with uvloop when
installed (it depends on it), as its CLI does.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import psycopg
from oban import Oban, job
from oban.schema import install_sql

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import batch_sizes, driver_main, emit_rate, paced, record_start, run_on_uvloop  # noqa: E402

LATENCY_DIR = os.environ.get("BENCH_LATENCY_DIR", "/tmp")


@job(queue="default")
async def noop() -> None:
    pass


@job(queue="default")
async def latency_job(enqueued_at: float) -> None:
    record_start(LATENCY_DIR, enqueued_at)


async def setup(args) -> None:
    async with await psycopg.AsyncConnection.connect(args.url, autocommit=True) as conn:
        await conn.execute(install_sql())


async def client(args) -> tuple[Oban, object]:
    """An Oban in client mode (no queues: it only inserts) and its pool."""
    pool = await Oban.create_pool(args.url, min_size=1, max_size=2)
    return Oban(pool=pool), pool


async def enqueue(args) -> None:
    oban, pool = await client(args)
    started = time.perf_counter()
    for size in batch_sizes(args.jobs, args.batch):
        await oban.enqueue_many([noop.new() for _ in range(size)])
    emit_rate(args.jobs, started)
    await pool.close()


async def worker(args) -> None:
    pool = await Oban.create_pool(args.url)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    async with Oban(pool=pool, queues={"default": args.limit}):
        print("READY", file=sys.stderr, flush=True)
        await stopping.wait()
    await pool.close()


async def latency(args) -> None:
    oban, pool = await client(args)
    await paced(args.jobs, args.interval, lambda: oban.enqueue(latency_job.new(time.time())))
    await pool.close()


def main() -> None:
    driver_main(globals(), run_on_uvloop, limit=100)


if __name__ == "__main__":
    main()
