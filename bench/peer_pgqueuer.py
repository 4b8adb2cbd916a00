"""PgQueuer driver for run.py, run inside bench/.peers-venv (asyncpg driver and uvloop, as `pgq run`).

    setup    --url U                       install PgQueuer's schema
    enqueue  --url U --jobs N --batch B    enqueue N no-op jobs in batches; RESULT jobs/s
    worker   --url U --batch 100 --latency-dir D
                                           a QueueManager until SIGTERM
    latency  --url U --jobs N --interval S enqueue N jobs one at a time, enqueue time in the payload
"""

from __future__ import annotations

import argparse
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
from common import emit, record_start  # noqa: E402


async def setup(args: argparse.Namespace) -> None:
    conn = await asyncpg.connect(args.url)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def enqueue(args: argparse.Namespace) -> None:
    conn = await asyncpg.connect(args.url)
    queries = Queries(AsyncpgDriver(conn))
    started = time.perf_counter()
    for lo in range(0, args.jobs, args.batch):
        size = min(args.batch, args.jobs - lo)
        await queries.enqueue(["noop"] * size, [None] * size, [0] * size)
    elapsed = time.perf_counter() - started
    await conn.close()
    emit({"jobs": args.jobs, "seconds": elapsed, "jobs_per_s": args.jobs / elapsed})


async def worker(args: argparse.Namespace) -> None:
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


async def latency(args: argparse.Namespace) -> None:
    conn = await asyncpg.connect(args.url)
    queries = Queries(AsyncpgDriver(conn))
    for _ in range(args.jobs):
        await queries.enqueue("latency", repr(time.time()).encode())
        await asyncio.sleep(args.interval)
    await conn.close()
    emit({"sent": args.jobs})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["setup", "enqueue", "worker", "latency"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--latency-dir", default=os.environ.get("BENCH_LATENCY_DIR", "/tmp"))
    args = parser.parse_args()
    # PgQueuer depends on uvloop and its own CLI (`pgq run`) runs on it: its best configuration.
    try:
        from uvloop import run
    except ImportError:
        run = asyncio.run
    run(globals()[args.command](args))


if __name__ == "__main__":
    main()
