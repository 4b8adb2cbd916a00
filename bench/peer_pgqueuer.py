"""PgQueuer driver for run.py, run inside bench/.peers-venv (asyncpg driver and uvloop, as `pgq run`).

    setup    --url U                       install PgQueuer's schema
    enqueue  --url U --jobs N --batch B    enqueue N no-op jobs in batches; RESULT jobs/s
    worker   --url U --batch 100 --latency-dir D
                                           a QueueManager until SIGTERM
    latency  --url U --jobs N --interval S enqueue N jobs one at a time, enqueue time in the payload
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from datetime import timedelta

import asyncpg
from pgqueuer import QueueManager
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import batch_sizes, driver_main, emit_rate, paced, record_start, run_on_uvloop  # noqa: E402


async def setup(args) -> None:
    conn = await asyncpg.connect(args.url)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def enqueue(args) -> None:
    conn = await asyncpg.connect(args.url)
    queries = Queries(AsyncpgDriver(conn))
    started = time.perf_counter()
    for size in batch_sizes(args.jobs, args.batch):
        await queries.enqueue(["noop"] * size, [None] * size, [0] * size)
    emit_rate(args.jobs, started)
    await conn.close()


async def worker(args) -> None:
    conn = await asyncpg.connect(args.url)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    latency_dir = args.latency_dir

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        pass

    @qm.entrypoint("latency")
    async def latency(job: Job) -> None:
        record_start(latency_dir, float(job.payload.decode()))

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, qm.shutdown.set)
    print("READY", file=sys.stderr, flush=True)
    await qm.run(batch_size=args.batch, dequeue_timeout=timedelta(seconds=30))
    await conn.close()


async def latency(args) -> None:
    conn = await asyncpg.connect(args.url)
    queries = Queries(AsyncpgDriver(conn))
    await paced(args.jobs, args.interval, lambda: queries.enqueue("latency", repr(time.time()).encode()))
    await conn.close()


def main() -> None:
    driver_main(globals(), run_on_uvloop, batch=100)


if __name__ == "__main__":
    main()
