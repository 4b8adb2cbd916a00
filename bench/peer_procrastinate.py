"""Procrastinate driver for run.py, run inside bench/.peers-venv (psycopg 3 connector).

    setup    --url U                        apply Procrastinate's schema
    enqueue  --url U --jobs N --batch B     batch_defer N no-op jobs; RESULT jobs/s
    worker   --url U --concurrency 16 --latency-dir D
                                            a worker until SIGTERM (listen/notify on)
    latency  --url U --jobs N --interval S  defer N jobs one at a time, enqueue time in the args
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import procrastinate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import batch_sizes, driver_main, emit_rate, paced, record_start  # noqa: E402


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


async def setup(args) -> None:
    app, _, _ = make_app(args.url, args.latency_dir)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def enqueue(args) -> None:
    app, noop, _ = make_app(args.url, args.latency_dir)
    async with app.open_async():
        started = time.perf_counter()
        for size in batch_sizes(args.jobs, args.batch):
            await noop.batch_defer_async(*([{}] * size))
        emit_rate(args.jobs, started)


async def worker(args) -> None:
    app, _, _ = make_app(args.url, args.latency_dir)
    async with app.open_async():
        print("READY", file=sys.stderr, flush=True)
        await app.run_worker_async(concurrency=args.concurrency, wait=True, install_signal_handlers=True)


async def latency(args) -> None:
    app, _, latency_task = make_app(args.url, args.latency_dir)
    async with app.open_async():
        await paced(args.jobs, args.interval, lambda: latency_task.defer_async(enqueued_at=time.time()))


def main() -> None:
    driver_main(globals(), asyncio.run, concurrency=16)


if __name__ == "__main__":
    main()
