"""The capacity model's figures: PostgreSQL CPU and WAL per job, API CPU per request, standby replay.

    .venv/bin/python bench/capacity.py [--jobs 20000] [--api-requests 2000] [--repeat 3]

Runs its own primary and synchronous hot standby (tests/pgcluster.py: the machine's
PostgreSQL binaries, fsync off: the OS keeps what is written, so CPU and WAL volume are
what they would be with fsync on; commit latency is not measured here). CPU is the
user+system time of every process of a server (postmaster, backends, WAL writer and sender,
startup/replay on the standby), read from /proc before and after each phase, divided by
the jobs (or requests) of the phase; the median of --repeat runs is printed. WAL bytes are
pg_current_wal_lsn() deltas on the primary.

Phases: enqueue in batches of 500 (commands.enqueue on one connection); claim 100 + complete
100 (what a worker's loop does per job); then through a `qforge api` process: POST /jobs one
job per request, GET /jobs/{id}, GET /jobs?limit=50 (API CPU from its /proc too).
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from pgcluster import Cluster  # noqa: E402  (a helper of the tests, shared)

from common import start_api  # noqa: E402

from qforge.commands import report  # noqa: E402
from qforge.commands.claim import claim  # noqa: E402
from qforge.commands.enqueue import JobSpec, enqueue  # noqa: E402
from qforge.migrate import migrate  # noqa: E402

DBNAME = "qforge"


def cpu_seconds(root_pid: int) -> float:
    """User + system CPU of a process and all its children (a PostgreSQL server, or the API)."""
    try:
        root = psutil.Process(root_pid)
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                pass
        return total
    except psutil.NoSuchProcess:
        return 0.0


def wal_lsn(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0]


class Meter:
    """CPU of the primary, the standby and (optionally) the API, and the primary's WAL, over a phase."""

    def __init__(self, cluster: Cluster, conn: psycopg.Connection, api_pid: int | None = None):
        self.cluster, self.conn, self.api_pid = cluster, conn, api_pid

    def __enter__(self) -> "Meter":
        self.cluster.wait_replayed(self.cluster.standbys[0])
        self.start = self._sample()
        return self

    def _sample(self) -> tuple[float, float, float, int]:
        api = cpu_seconds(self.api_pid) if self.api_pid else 0.0
        return (cpu_seconds(self.cluster.primary.process.pid), cpu_seconds(self.cluster.standbys[0].process.pid),
                api, int(wal_lsn(self.conn)))

    def __exit__(self, *exc: object) -> None:
        self.cluster.wait_replayed(self.cluster.standbys[0])
        end = self._sample()
        self.primary, self.standby, self.api, self.wal = (e - s for e, s in zip(end, self.start))

    def per(self, count: int) -> dict[str, float]:
        return {"primary_us": self.primary / count * 1e6, "standby_us": self.standby / count * 1e6,
                "api_us": self.api / count * 1e6, "wal_bytes": self.wal / count}


def run_once(jobs: int, api_requests: int) -> dict[str, dict[str, float]]:
    cluster = Cluster()
    results: dict[str, dict[str, float]] = {}
    api = None
    try:
        cluster.primary.sql(f"CREATE DATABASE {DBNAME}")
        url = cluster.primary.url(DBNAME)
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
        cluster.add_standby(synchronous=True)
        with psycopg.connect(url, autocommit=True) as conn:
            with Meter(cluster, conn) as meter:
                for start in range(0, jobs, 500):
                    enqueue(conn, [JobSpec(task="echo", payload={"n": n}) for n in range(start, min(jobs, start + 500))])
            results["enqueue, batches of 500"] = meter.per(jobs)
            with Meter(cluster, conn) as meter:
                done = 0
                while done < jobs:
                    claimed = claim(conn, ["default"], 100, "bench")
                    if not claimed:
                        break
                    report.complete(conn, [report.Report(c.id, c.attempt, result={"ok": True}) for c in claimed],
                                    actor="bench")
                    done += len(claimed)
            results["claim 100 + complete 100"] = meter.per(done)

            api, base = start_api(url, subprocess.DEVNULL)
            with httpx.Client(base_url=base, timeout=30) as client:
                client.get("/jobs?limit=1")  # warm the pool
                ids: list[str] = []
                with Meter(cluster, conn, api.pid) as meter:
                    for n in range(api_requests):
                        ids.append(client.post("/jobs", json={"task": "echo", "payload": {"n": n}}).json()["id"])
                results["POST /jobs (one job)"] = meter.per(api_requests)
                with Meter(cluster, conn, api.pid) as meter:
                    for _ in range(api_requests):
                        client.get(f"/jobs/{random.choice(ids)}").raise_for_status()
                results["GET /jobs/{id}"] = meter.per(api_requests)
                with Meter(cluster, conn, api.pid) as meter:
                    for _ in range(api_requests):
                        client.get("/jobs", params={"limit": 50}).raise_for_status()
                results["GET /jobs?limit=50"] = meter.per(api_requests)
    finally:
        if api is not None:
            api.terminate()
            api.wait(timeout=30)
        cluster.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--api-requests", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs = [run_once(args.jobs, args.api_requests) for _ in range(args.repeat)]
    print(f"median of {args.repeat} runs; {args.jobs} jobs, {args.api_requests} API requests per phase")
    print(f"{'phase':<28} {'primary CPU µs/job':>19} {'standby µs':>11} {'API µs/req':>11} {'WAL B/job':>10}")
    for phase in runs[0]:
        med = {key: statistics.median(run[phase][key] for run in runs) for key in runs[0][phase]}
        api = f"{med['api_us']:11.0f}" if med["api_us"] else f"{'-':>11}"
        print(f"{phase:<28} {med['primary_us']:19.1f} {med['standby_us']:11.1f} {api} {med['wal_bytes']:10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
