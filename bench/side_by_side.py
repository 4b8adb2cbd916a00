"""Side-by-side runs of QForge's real commands on one connection each, stepped batch by batch, with
the PostgreSQL CPU time of each connection's server process (/proc/<pid>/schedstat: PostgreSQL on
this machine), which a noisy neighbour disturbs far less than wall time (qf_audit, qf_single)."""

from __future__ import annotations

import json
import time

import psycopg

from qforge.commands.claim import claim
from qforge.commands.enqueue import JobSpec, enqueue
from qforge.sql import q
from common import in_turns


def server_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as stat:
        return int(stat.read().split()[0])


class Run:
    """One variant's database and connection, stepped batch by batch (so that several runs can take
    turns), adding up its server process's CPU time and the wall time per step, client included."""

    def __init__(self, url: str, statements: list[str], queries: dict[str, str]) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        for name in statements:
            self.conn.execute(queries[name])
        self.pid = self.conn.info.backend_pid
        self.ns = {"enqueue": 0, "claim": 0, "complete": 0}
        self.wall = {"enqueue": 0.0, "drain": 0.0}
        self.enqueued = self.done = 0

    def enqueue(self, n: int) -> None:
        started, wall = server_ns(self.pid), time.perf_counter()
        enqueue(self.conn, [JobSpec(task="bench_noop") for _ in range(n)], actor="bench")
        self.ns["enqueue"] += server_ns(self.pid) - started
        self.wall["enqueue"] += time.perf_counter() - wall
        self.enqueued += n

    def drain(self, batch: int) -> int:
        """Claim up to `batch` jobs as a worker claims (statement and plan) and complete them."""
        started, wall = server_ns(self.pid), time.perf_counter()
        claimed = claim(self.conn, ["default"], batch, "bench")
        self.ns["claim"] += server_ns(self.pid) - started
        if claimed:
            reports = json.dumps([{"id": str(job.id), "attempt": job.attempt, "result": None} for job in claimed])
            started = server_ns(self.pid)
            with self.conn.transaction():
                self.conn.execute(q("job_complete"), {"reports": reports, "actor": "bench", "now": None}).fetchall()
            self.ns["complete"] += server_ns(self.pid) - started
            self.done += len(claimed)
        self.wall["drain"] += time.perf_counter() - wall
        return len(claimed)

    def figures(self) -> dict[str, float]:
        """µs per job: PostgreSQL CPU per step, and the wall time of enqueue and of claim + complete."""
        if self.done != self.enqueued:
            raise RuntimeError(f"drained {self.done} of {self.enqueued} jobs")
        jobs = self.enqueued
        return {**{step: ns / 1e3 / jobs for step, ns in self.ns.items()},
                "enqueue_wall": self.wall["enqueue"] * 1e6 / jobs, "drain_wall": self.wall["drain"] * 1e6 / jobs}

    def close(self) -> None:
        self.conn.close()


def measure_side_by_side(runs: list[Run], jobs: int, batch: int) -> None:
    """Every run enqueues `jobs` and drains them, taking turns batch by batch (the first of each turn
    alternating), so that a noisy neighbour's bursts fall on all of them alike."""
    for turn, first in enumerate(range(0, jobs, 1000)):
        for run in in_turns(runs, turn):
            run.enqueue(min(1000, jobs - first))
    for run in runs:
        run.conn.execute("ANALYZE jobs")
    active, turn = list(runs), 0
    while active:
        for run in in_turns(active, turn):
            if not run.drain(batch):
                active.remove(run)
        turn += 1
