"""Helpers for the worker and monitor tests: real `qforge` processes, polling waits, job factories.

A module of helpers (it holds no tests) shared by tests/test_worker*.py and
tests/test_monitor*.py; it is named like a test module only because those are
the files the worker tests own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar
from uuid import UUID

import psycopg
import pytest
from psycopg.rows import dict_row, tuple_row

from qforge.commands.enqueue import JobSpec, enqueue
from qforge.db import role_name, with_credentials
from qforge.events import store
from qforge.events.types import Event

T = TypeVar("T")

QFORGE = Path(sys.executable).parent / "qforge"

# Fast clocks so recoveries happen in seconds. The stale limit stays well
# above two heartbeat intervals: a worker only beats jobs older than half an
# interval, so a beat can be up to 1.5 intervals old.
FAST_ENV = {
    "QFORGE_HEARTBEAT_SECONDS": "0.5",
    "QFORGE_STALE_SECONDS": "2",
    "QFORGE_MONITOR_TICK_SECONDS": "0.5",
    "QFORGE_BACKOFF_BASE_SECONDS": "0.1",
    "QFORGE_POLL_INTERVAL_SECONDS": "0.5",
    "QFORGE_SHUTDOWN_GRACE_SECONDS": "5",
}
STALE_SECONDS = float(FAST_ENV["QFORGE_STALE_SECONDS"])
TICK_SECONDS = float(FAST_ENV["QFORGE_MONITOR_TICK_SECONDS"])

# Task modules the tests load with --tasks (from a temp dir put on PYTHONPATH).
TEST_TASKS = textwrap.dedent('''
    """Tasks for the worker tests."""
    import asyncio
    import os
    import signal

    from qforge.workers.tasks import TaskError, task


    @task("test_suicide")
    def suicide(payload):
        os.kill(os.getpid(), signal.SIGKILL)


    @task("test_boom")
    def boom(payload):
        raise ValueError("boom " + str(payload.get("n")))


    @task("test_task_error")
    async def task_error(payload):
        raise TaskError("refused politely", reason="invalid_input", result={"partial": 1})


    @task("test_nul_result")
    async def nul_result(payload):
        return {"text": "a\\u0000b"}


    @task("test_sleep_first_attempt")
    async def sleep_first_attempt(payload, ctx):
        if ctx.attempt == 1:
            await asyncio.sleep(payload.get("seconds", 30))
        return {"attempt": ctx.attempt}


    @task("test_sync_sleep")
    def sync_sleep(payload):
        import time
        time.sleep(payload.get("seconds", 0.01))
        return {"slept": payload.get("seconds", 0.01)}
''')


def wait_for(predicate: Callable[[], T], *, timeout: float, message: str, interval: float = 0.05) -> T:
    """Poll until `predicate()` is truthy and return it; fail with `message` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {message}")
        time.sleep(interval)


class Proc:
    """A `qforge` subprocess whose output goes to a log file."""

    def __init__(self, popen: subprocess.Popen, log_path: Path, kind: str) -> None:
        self.popen, self.log_path, self.kind = popen, log_path, kind

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def default_name(self) -> str:
        """The name a worker or monitor gives itself without --name."""
        return f"{socket.gethostname()}-{self.pid}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signum)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_log(self, text: str, timeout: float = 10) -> None:
        wait_for(lambda: text in self.log(), timeout=timeout, message=f"{text!r} in the {self.kind} log")


PROCESS_ROLES = ("api", "worker", "monitor")


def role_url(db_url: str, kind: str) -> str:
    """`db_url` logged in as the role of a kind of process (api, worker, monitor, read)."""
    return with_credentials(db_url, role_name("qforge", kind), None)


class Processes:
    """Starts `qforge worker` / `qforge monitor` against one database; kills them all at the end."""

    def __init__(self, db_url: str, log_dir: Path, tasks_dir: Path) -> None:
        self.db_url, self.log_dir, self.tasks_dir = db_url, log_dir, tasks_dir
        self.started: list[Proc] = []

    def _spawn(self, kind: str, args: list[str], env: dict[str, str] | None) -> Proc:
        # Every process on its own least-privileged role (issue 30; the test server
        # trusts local connections, so no passwords); others as the schema owner.
        url = role_url(self.db_url, kind) if kind in PROCESS_ROLES else self.db_url
        full_env = {**os.environ, **FAST_ENV, **(env or {})}
        if kind == "api":
            full_env.setdefault("QFORGE_READONLY_DATABASE_URL", role_url(self.db_url, "read"))
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(self.tasks_dir), full_env.get("PYTHONPATH", "")) if p)
        log_path = self.log_dir / f"{kind}-{len(self.started)}.log"
        with open(log_path, "wb") as log_file:
            popen = subprocess.Popen([str(QFORGE), kind, "--database-url", url, *args],
                                     stdout=log_file, stderr=subprocess.STDOUT, env=full_env)
        proc = Proc(popen, log_path, kind)
        self.started.append(proc)
        return proc

    def worker(self, *args: str, env: dict[str, str] | None = None) -> Proc:
        return self._spawn("worker", list(args), env)

    def monitor(self, env: dict[str, str] | None = None) -> Proc:
        return self._spawn("monitor", [], env)

    def close(self) -> None:
        for proc in self.started:
            if proc.popen.poll() is None:
                proc.popen.kill()
        for proc in self.started:
            proc.popen.wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(f"--- {p.kind} {p.pid} ---\n{p.log()}" for p in self.started)


@pytest.fixture
def tasks_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "qf_test_tasks.py").write_text(TEST_TASKS)
    return folder


@pytest.fixture
def procs(db_url: str, tmp_path: Path, tasks_dir: Path) -> Iterator[Processes]:
    processes = Processes(db_url, tmp_path, tasks_dir)
    try:
        yield processes
    finally:
        processes.close()
        print(processes.logs())  # pytest shows captured output only for failing tests


# --- database helpers ------------------------------------------------------------


def add_jobs(conn: psycopg.Connection, *specs: dict[str, Any]) -> list[UUID]:
    return [e.id for e in enqueue(conn, [JobSpec(**spec) for spec in specs], actor="test")]


def job(conn: psycopg.Connection, job_id: UUID) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM jobs WHERE id = %s", (job_id,))
        return cur.fetchone()


def statuses(conn: psycopg.Connection, ids: list[UUID]) -> dict[UUID, str]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT id, status FROM jobs WHERE id = ANY(%s)", (ids,))
        return {row["id"]: row["status"] for row in cur.fetchall()}


def scalar(conn: psycopg.Connection, query: str, *params: Any) -> Any:
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(query, params).fetchone()
    return None if row is None else row[0]


def count_status(conn: psycopg.Connection, status: str) -> int:
    return scalar(conn, "SELECT count(*) FROM jobs WHERE status = %s", status)


def history(conn: psycopg.Connection, job_id: UUID, *, heartbeats: bool = False) -> list[Event]:
    return [e for e in store.read_stream(conn, job_id) if heartbeats or e.type != "Heartbeat"]


def types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


def succeeded_counts(conn: psycopg.Connection) -> dict[UUID, int]:
    """Succeeded events per job, for the exactly-once checks."""
    with conn.cursor(row_factory=tuple_row) as cur:
        rows = cur.execute("SELECT stream_id, count(*) FROM events WHERE type = 'Succeeded'"
                           " GROUP BY stream_id").fetchall()
    return dict(rows)


def registry(conn: psycopg.Connection, name: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM workers WHERE name = %s", (name,))
        return cur.fetchone()


def process_running(marker: str) -> bool:
    """Whether any live (non-zombie) process has `marker` in its command line."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            return True
    return False


def kill(proc: Proc) -> None:
    proc.signal(signal.SIGKILL)
    proc.wait(timeout=10)
