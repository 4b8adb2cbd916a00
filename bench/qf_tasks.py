"""QForge tasks for the benchmarks, loaded by `qforge worker --tasks qf_tasks` (run.py puts bench/ on PYTHONPATH)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import record_start  # noqa: E402

from qforge.workers.tasks import task

LATENCY_DIR = os.environ.get("BENCH_LATENCY_DIR", "/tmp")


@task("bench_noop")
async def bench_noop(payload: dict) -> None:
    return None


@task("bench_latency")
async def bench_latency(payload: dict) -> None:
    # The start time is taken here, inside the task, as for the peers.
    record_start(LATENCY_DIR, payload["enqueued_at"])
