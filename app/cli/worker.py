"""`qforge worker`: load the task modules, wait for a current schema, then run a worker pool."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
import threading
import time

from qforge import tracing
from qforge.cli import split_csv
from qforge.cli.common import complain, configure_logging, database_url, wait_for_schema
from qforge.settings import get_settings
from qforge.workers.host import IsolationError
from qforge.workers.tasks import load_task_modules
from qforge.workers.worker import Worker, default_name

log = logging.getLogger("qforge.worker")

YOUNG_GENERATION_OBJECTS = 10_000  # gc's first threshold in a worker (Python's default: 700)


def run(args: argparse.Namespace) -> int:
    settings = get_settings()
    configure_logging(settings)
    tracing.configure("qforge-worker")  # from OTEL_* variables, when set
    queues = list(dict.fromkeys(split_csv(args.queues))) or ["default"]  # a queue named twice would claim twice
    if args.concurrency < 1:
        complain("worker", "--concurrency must be at least 1")
        return 2
    try:
        load_task_modules(split_csv(args.tasks))
    except ImportError as exc:
        complain("worker", exc)
        return 2
    url = database_url("worker", args.database_url, role="worker")
    if url is None or not wait_for_schema("worker", url):
        return 1
    try:
        worker = Worker(url, name=args.name or default_name(), queues=queues, concurrency=args.concurrency,
                        allow_shell=args.allow_shell, settings=settings)
    except IsolationError as exc:
        complain("worker", exc)
        return 2
    # What is loaded by now (modules, task modules, settings) lives as long as the process: out of
    # the collector's sight (as in `qforge api`), so a full collection does not walk it again. And a
    # young generation of 10,000 objects rather than 700: each claimed job lives as ~15 tracked
    # objects (its record, task, coroutines, context, report) until its report is written, so with
    # 700 a busy worker collected every ~50 jobs, walking the jobs in flight each time (measured in
    # a 50,000-job drain by two workers: 2 us of CPU per job; with 10,000, no collection at all).
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_GENERATION_OBJECTS, *gc.get_threshold()[1:])
    code = asyncio.run(worker.run())
    worker.task_threads.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + 0.5  # idle pool threads exit at once; busy ones are abandoned sync tasks
    for thread in [t for t in threading.enumerate() if t.name.startswith("qforge-task")]:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    stuck = [t for t in threading.enumerate() if t.name.startswith("qforge-task") and t.is_alive()]
    if stuck:
        # Abandoned sync tasks cannot be interrupted, and the interpreter would
        # join their threads at exit. Everything is reported: leave now.
        log.warning("%d task threads still running (abandoned sync tasks); exiting without them", len(stuck))
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
