"""Procrastinate driver for run.py, run inside bench/.peers-venv (psycopg 3 connector).

    setup    --url U                        apply Procrastinate's schema
    enqueue  --url U --jobs N --batch B     batch_defer N no-op jobs; RESULT jobs/s
    worker   --url U --concurrency 16 --latency-dir D
                                            a worker until SIGTERM (listen/notify on)
    latency  --url U --jobs N --interval S  defer N jobs one at a time, enqueue time in the args
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import procrastinate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, record_start  # noqa: E402


def make_app(url: str, latency_dir: str):
    """The app and its two tasks; Procrastinate's worker finds tasks by name in this app."""
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop")
    async def noop() -> None:
        pass

    @app.task(name="latency")
    async def latency(enqueued_at: float) -> None:
        record_start(latency_dir, enqueued_at)

    return app, noop, latency


async def setup(args: argparse.Namespace) -> None:
    app, _, _ = make_app(args.url, args.latency_dir)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def enqueue(args: argparse.Namespace) -> None:
    app, noop, _ = make_app(args.url, args.latency_dir)
    async with app.open_async():
        started = time.perf_counter()
        for lo in range(0, args.jobs, args.batch):
            size = min(args.batch, args.jobs - lo)
            await noop.batch_defer_async(*([{}] * size))
        elapsed = time.perf_counter() - started
    emit({"jobs": args.jobs, "seconds": elapsed, "jobs_per_s": args.jobs / elapsed})


async def worker(args: argparse.Namespace) -> None:
    app, _, _ = make_app(args.url, args.latency_dir)
    async with app.open_async():
        print("READY", file=sys.stderr, flush=True)
        await app.run_worker_async(concurrency=args.concurrency, wait=True, install_signal_handlers=True)


async def latency(args: argparse.Namespace) -> None:
    app, _, latency_task = make_app(args.url, args.latency_dir)
    async with app.open_async():
        for _ in range(args.jobs):
            await latency_task.defer_async(enqueued_at=time.time())
            await asyncio.sleep(args.interval)
    emit({"sent": args.jobs})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["setup", "enqueue", "worker", "latency"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--latency-dir", default=os.environ.get("BENCH_LATENCY_DIR", "/tmp"))
    args = parser.parse_args()
    asyncio.run(globals()[args.command](args))


if __name__ == "__main__":
    main()
