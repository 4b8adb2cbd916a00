"""Code workflows, QForge beside DBOS Transact on the same PostgreSQL: a 10-step sequential workflow and
one step then a fan-out of 10, N of each: workflows/s, CPU per step (the workers and the PostgreSQL
backends serving the benchmark's database: see BackendCpu),
step-to-next-step latency p50/p99 (a step's start minus the end of the step it waited for, both
taken inside the step functions).

    python bench/code_vs_dbos.py [--server-url postgresql://postgres@127.0.0.1:5432/postgres] [--count 1000]
                                 [--repeat 3] [--db-prefix NAME_]

The databases are qf_code_bench and dbos_code_bench on the server, dropped and made again for
each run (--db-prefix puts a prefix on both names: benchmarks of several worktrees on one server).

With --repeat N each shape runs N times, QForge and DBOS in turn (a shared, noisy host: each
pair runs under the same load), and the medians of each figure close the output, with the ratios.

QForge: two `qforge worker --concurrency 16` processes. DBOS 3.x: one process, queues of 32 with a
0.1 s polling interval (its default is 1 s), from the venv .venv-dbos (pip install dbos).
Both run 32 things at once: QForge's 32 slots each hold a step or a run of the function while it
runs (the workflows in flight are not capped, but sampled during a sequential run they stayed at
about 32: running workflows' steps are claimed before new workflows' first runs), DBOS's queue runs
32 workflows (each runs its steps in its own thread) and its second queue the fan-out's steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import psutil

sys.path.insert(0, str(Path(__file__).parent))
from common import recreate  # noqa: E402

HERE = Path(__file__).parent
QFORGE = Path(sys.executable).parent / "qforge"
DBOS_PYTHON = HERE.parent / ".venv-dbos" / "bin" / "python"
STEPS = {"sequential": 10, "fan_out": 11}


class BackendCpu:
    """CPU seconds of the PostgreSQL backends serving one database (its name in pg_stat_activity),
    sampled every `every` seconds while it runs: the server is shared with other benchmarks, so
    the whole server's CPU would count theirs too. A backend's last fraction of a sample before it
    exits is not counted (both sides keep their connections for the whole run); the server's own
    background processes (WAL writer, checkpointer) are not counted for either side."""

    def __init__(self, admin_url: str, database: str, every: float = 0.2) -> None:
        self.admin_url, self.database, self.every = admin_url, database, every
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "BackendCpu":
        self._sample()  # backends already there count from now, new ones from zero
        self.first = dict(self.last)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def seconds(self) -> float:
        self._sample()
        return sum(cpu - self.first.get(pid, 0.0) for pid, cpu in self.last.items())

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            self._sample()

    def _sample(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            pids = [pid for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.database,)).fetchall()]
        for pid in pids:
            try:
                times = psutil.Process(pid).cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            self.last[pid] = times.user + times.system


def gaps(shape: str, result: list) -> list[float]:
    """Step-to-next-step latencies of one workflow's result (each step returns its t0 and t1)."""
    if shape == "sequential":
        return [after["t0"] - before["t1"] for before, after in zip(result, result[1:])]
    first, group = result
    return [step["t0"] - first["t1"] for step in group]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def qforge_side(url: str, shape: str, count: int, admin_url: str, database: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(HERE), "QFORGE_POLL_INTERVAL_SECONDS": "1"}
    workers = [subprocess.Popen([str(QFORGE), "worker", "--database-url", url, "--concurrency", "16",
                                 "--tasks", "bench_code_tasks", "--name", f"bench-{i}"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    try:
        time.sleep(3)  # both workers up and idle before the clock starts
        import qforge
        procs = [psutil.Process(w.pid) for w in workers]
        cpu_before = sum(sum(p.cpu_times()[:2]) for p in procs)
        backends = BackendCpu(admin_url, database).__enter__()
        started = time.perf_counter()
        with psycopg.connect(url) as conn:
            ids = [qforge.start(conn, f"bench_{shape}") for _ in range(count)]
            conn.commit()
            while conn.execute("SELECT count(*) FROM workflows WHERE status = 'running'").fetchone()[0]:
                time.sleep(0.05)
            wall = time.perf_counter() - started
            cpu = sum(sum(p.cpu_times()[:2]) for p in procs) - cpu_before
            pg = backends.seconds()
            backends.__exit__()
            rows = conn.execute("SELECT status, result FROM workflows WHERE id = ANY(%s)", (ids,)).fetchall()
        assert all(status == "succeeded" for status, _ in rows), {status for status, _ in rows}
        return {"wall": wall, "cpu": cpu, "pg_cpu": pg, "results": [result for _, result in rows]}
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(timeout=30)


def dbos_side(url: str, shape: str, count: int, admin_url: str, database: str) -> dict:
    with BackendCpu(admin_url, database) as backends:
        done = subprocess.run([str(DBOS_PYTHON), str(HERE / "peer_dbos_workflows.py"), url, shape, str(count)],
                              capture_output=True, text=True, check=True, timeout=3600)
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        measured["pg_cpu"] = backends.seconds()  # includes its launch and shutdown
    return measured


def report(system: str, shape: str, count: int, measured: dict) -> dict:
    latencies = [gap for result in measured["results"] for gap in gaps(shape, result)]
    steps = count * STEPS[shape]
    row = {"system": system, "shape": shape, "workflows": count,
           "workflows_per_s": round(count / measured["wall"], 1),
           "cpu_ms_per_step": round((measured["cpu"] + measured["pg_cpu"]) * 1000 / steps, 3),
           "worker_cpu_ms_per_step": round(measured["cpu"] * 1000 / steps, 3),
           "pg_cpu_ms_per_step": round(measured["pg_cpu"] * 1000 / steps, 3),
           "step_to_step_p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
           "step_to_step_p99_ms": round(percentile(latencies, 0.99) * 1000, 2)}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", choices=["qforge", "dbos"], default=None)
    parser.add_argument("--db-prefix", default="", help="a prefix for the names of both databases")
    args = parser.parse_args()
    qf_db, dbos_db = f"{args.db_prefix}qf_code_bench", f"{args.db_prefix}dbos_code_bench"
    rows = []
    for _ in range(args.repeat):
        for shape in ("sequential", "fan_out"):
            if args.only in (None, "qforge"):
                url = recreate(args.server_url, qf_db)
                subprocess.run([str(QFORGE), "migrate", "--database-url", url], check=True, capture_output=True)
                rows.append(report("qforge", shape, args.count,
                                   qforge_side(url, shape, args.count, args.server_url, qf_db)))
            if args.only in (None, "dbos"):
                url = recreate(args.server_url, dbos_db)
                rows.append(report("dbos", shape, args.count,
                                   dbos_side(url, shape, args.count, args.server_url, dbos_db)))
    if args.repeat > 1:
        medians(rows)


FIGURES = ("workflows_per_s", "cpu_ms_per_step", "worker_cpu_ms_per_step", "pg_cpu_ms_per_step",
           "step_to_step_p50_ms", "step_to_step_p99_ms")


def medians(rows: list[dict]) -> None:
    """The median of each figure per system and shape, and QForge's over DBOS's."""
    table: dict[tuple[str, str], dict] = {}
    for key in {(row["system"], row["shape"]) for row in rows}:
        runs = [row for row in rows if (row["system"], row["shape"]) == key]
        table[key] = {name: statistics.median(row[name] for row in runs) for name in FIGURES}
    print(f"{'shape':11} {'system':7} " + " ".join(f"{name:>22}" for name in FIGURES))
    for shape in ("sequential", "fan_out"):
        for system in ("qforge", "dbos"):
            if (system, shape) in table:
                print(f"{shape:11} {system:7} " + " ".join(f"{table[system, shape][name]:22}" for name in FIGURES))
        if ("qforge", shape) in table and ("dbos", shape) in table:
            print(f"{shape:11} {'ratio':7} " + " ".join(
                f"{table['qforge', shape][name] / table['dbos', shape][name]:22.2f}" for name in FIGURES))


if __name__ == "__main__":
    main()
