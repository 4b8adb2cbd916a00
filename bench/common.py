"""Helpers shared by every benchmark script, standard library only (the peers' venv imports it too)."""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from typing import Any, Iterable, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def with_database(url: str, dbname: str) -> str:
    """The same server with another database name (postgresql:// URLs only)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + quote(dbname, safe="")))


def recreate(admin_url: str, name: str, template: str | None = None, *, file_copy: bool = False) -> str:
    """Drop database `name` and create it again, empty or as a copy of `template` (file_copy:
    STRATEGY FILE_COPY, copying files rather than WAL-logging every page: for big histories,
    PostgreSQL 15+); its URL. (psycopg is imported here: the peers' venv imports this module.)"""
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
            if file_copy:
                statement = sql.SQL("{} STRATEGY FILE_COPY").format(statement)
        admin.execute(statement)
    return with_database(admin_url, name)


def load_queries(path: str) -> dict[str, str]:
    """The `-- name: x` sections of a .sql file (the project's convention, see app/sql)."""
    import re

    with open(path) as handle:
        text = handle.read()
    marks = list(re.finditer(r"^--\s*name:\s*([a-z0-9_]+)\s*$", text, re.MULTILINE))
    return {m.group(1): text[m.end():(marks[i + 1].start() if i + 1 < len(marks) else len(text))].strip()
            for i, m in enumerate(marks)}


def emit(result: dict[str, Any]) -> None:
    """A driver's answer to run.py: one JSON line on stdout, prefixed so logs cannot be mistaken for it."""
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


def admin_parser(doc: str, *, repeat: int = 3) -> Any:
    """The argument parser of a script that creates its own databases beside --database-url:
    that option and --repeat; the script adds its own."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="admin URL; databases are created beside it")
    parser.add_argument("--repeat", type=int, default=repeat)
    return parser


def driver_arguments(verbs: list[str], **defaults: Any) -> Any:
    """The command line every driver takes: a verb, --url, --jobs, --batch, --interval,
    --latency-dir, and the driver's own options given as name=default."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=verbs)
    parser.add_argument("--url", required=True)
    options = {"jobs": 100_000, "batch": 1000, "interval": 0.01, **defaults}
    for name, default in options.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    parser.add_argument("--latency-dir", default=os.environ.get("BENCH_LATENCY_DIR", "/tmp"),
                        help="where the latency task writes its start times (workers: BENCH_LATENCY_DIR)")
    return parser.parse_args()


def run_on_uvloop(coroutine: Any) -> Any:
    """Run an async driver verb on uvloop when its venv has it (PgQueuer's `pgq run` and Oban's CLI
    do: their best configuration), else on asyncio's own loop."""
    try:
        from uvloop import run
    except ImportError:
        import asyncio

        run = asyncio.run
    return run(coroutine)


DRIVER_VERBS = ["setup", "enqueue", "worker", "latency"]


def driver_main(verbs: dict[str, Any], run: Any = None, **defaults: Any) -> None:
    """A driver's main: parse its command line (driver_arguments) and run the verb's function of
    `verbs` (the driver's globals()), through `run` for coroutines (asyncio.run, run_on_uvloop)."""
    args = driver_arguments(DRIVER_VERBS, **defaults)
    done = verbs[args.command](args)
    if run is not None:
        run(done)


async def paced(jobs: int, interval: float, send: Any) -> None:
    """The latency verb's loop: `await send()` `jobs` times, `interval` seconds apart, then its RESULT."""
    import asyncio

    for _ in range(jobs):
        await send()
        await asyncio.sleep(interval)
    emit({"sent": jobs})


def batch_sizes(jobs: int, batch: int) -> list[int]:
    """`jobs` cut into batches of at most `batch`."""
    return [min(batch, jobs - lo) for lo in range(0, jobs, batch)]


def emit_rate(jobs: int, started: float) -> None:
    """The enqueue verb's answer: `jobs` since perf_counter() read `started`."""
    elapsed = time.perf_counter() - started
    emit({"jobs": jobs, "seconds": elapsed, "jobs_per_s": jobs / elapsed})


def parse_result(stdout: str) -> dict[str, Any]:
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"no RESULT line in driver output:\n{stdout[-2000:]}")


def free_port() -> int:
    """A TCP port of 127.0.0.1 nobody listens on right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_api(url: str, log: Any, *, timeout: float = 60,
              env: dict[str, str] | None = None) -> tuple[Any, str]:
    """A `qforge api` (this interpreter's qforge) serving database `url` on a free port, in its own
    session, output to `log` (a file or subprocess.DEVNULL), `env` added to its environment, once
    /healthz answers: (the process, its base URL). (httpx and qforge: the project's venv only.)"""
    import subprocess

    import httpx

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "QFORGE_LOG_LEVEL": "WARNING", **(env or {})}
    process = subprocess.Popen([sys.executable, "-m", "qforge.cli", "api", "--database-url", url, "--port", str(port)],
                               stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return process, base
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"qforge api did not start (exit {process.poll()}; output in"
                               f" {getattr(log, 'name', '-')})")
        time.sleep(0.2)


# --- CPU -----------------------------------------------------------------------


def machine_busy_seconds() -> float:
    """CPU seconds spent not idle by all cores since boot (/proc/stat, first line)."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    # guest time is already inside user; idle and iowait are not work.
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of one process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            raw = stat.read()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def children_of(parent_pids: Iterable[int]) -> set[int]:
    """Every live process whose parent is one of `parent_pids` (one level)."""
    parents = set(parent_pids)
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                raw = stat.read()
        except OSError:
            continue
        ppid = int(raw[raw.rindex(")") + 2:].split()[1])
        if ppid in parents:
            found.add(int(entry))
    return found


def descendants_of(root_pids: Iterable[int]) -> set[int]:
    found = set(root_pids)
    frontier = set(found)
    while frontier:
        frontier = children_of(frontier) - found
        found |= frontier
    return found


class CpuWindow:
    """Whole-machine busy CPU over a window, plus the CPU of named groups of processes.

    The machine is shared: other work shows up in the machine figure but not in
    the attributed one (the workers plus the PostgreSQL processes of this run).
    """

    def __init__(self, groups: dict[str, set[int]] | None = None) -> None:
        self.groups = {name: set(pids) for name, pids in (groups or {}).items()}
        self.machine_start = machine_busy_seconds()
        self.process_start = {pid: process_cpu_seconds(pid) for pids in self.groups.values() for pid in pids}
        self.wall_start = time.perf_counter()

    def stop(self, late: dict[str, set[int]] | None = None) -> dict[str, float]:
        """`late`: processes of a group first seen at the end (a backend that connected meanwhile);
        all their CPU falls inside the window."""
        machine = machine_busy_seconds() - self.machine_start
        wall = time.perf_counter() - self.wall_start
        used = {"machine_cpu_s": machine, "wall_s": wall}
        for name, pids in self.groups.items():
            pids = pids | (late or {}).get(name, set())
            used[f"{name}_cpu_s"] = max(0.0, sum(process_cpu_seconds(pid) - self.process_start.get(pid, 0.0)
                                                 for pid in pids))
        used["attributed_cpu_s"] = sum(used[f"{name}_cpu_s"] for name in self.groups)
        return used


# --- statistics ------------------------------------------------------------------


def summarize(values: list[float]) -> dict[str, Any]:
    """Median, min and max of the repetitions (the table shows all three)."""
    clean = [v for v in values if v is not None]
    if not clean:
        return {"median": None, "min": None, "max": None, "values": values}
    return {"median": statistics.median(clean), "min": min(clean), "max": max(clean), "values": values}


T = TypeVar("T")


def in_turns(items: list[T], turn: int) -> list[T]:
    """`items` starting at the turn-th (modulo): who goes first changes every turn, so that a
    noisy moment of this machine does not always fall on the same side."""
    first = turn % len(items)
    return items[first:] + items[:first]


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    # the smallest value with at least `fraction` of them at or below it: rank ceil(fraction * n)
    # (the tolerance keeps 0.99 * 100 from becoming 100 in floating point)
    rank = max(1, math.ceil(fraction * len(sorted_values) - 1e-9))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def read_latency_files(paths: Iterable[str]) -> list[float]:
    """Lines "enqueued_at started_at" written by the latency tasks -> latencies in ms."""
    latencies = []
    for path in paths:
        try:
            with open(path) as handle:
                for line in handle:
                    parts = line.split()
                    if len(parts) == 2:
                        latencies.append((float(parts[1]) - float(parts[0])) * 1000.0)
        except FileNotFoundError:
            continue
    return latencies


def record_start(directory: str, enqueued_at: float) -> None:
    """Called inside a latency task: append "enqueued_at started_at" to this process's file."""
    started_at = time.time()
    with open(os.path.join(directory, f"latency-{os.getpid()}.txt"), "a") as handle:
        handle.write(f"{enqueued_at!r} {started_at!r}\n")
