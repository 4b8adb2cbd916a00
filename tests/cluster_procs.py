"""Helpers shared by the failover, standby and partition tests: a PostgreSQL cluster fixture, a
`qforge api` subprocess, and an API client that retries what a failover makes it retry."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import httpx
import psycopg
import pytest

from pgcluster import Cluster, find_bindir, free_port, server_user
from qforge.cli.dev import healthy
from qforge.migrate import migrate
from test_worker_support import QFORGE, Proc, Processes, succeeded_counts, wait_for

DBNAME = "qforge"


def require_binaries() -> None:
    if find_bindir() is None:
        pytest.skip("no PostgreSQL binaries (initdb, postgres, pg_basebackup) on this machine")
    try:
        server_user()
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A migrated primary (database ``qforge``) with a synchronous hot standby."""
    require_binaries()
    built = Cluster()
    try:
        built.primary.sql(f"CREATE DATABASE {DBNAME}")
        with psycopg.connect(built.primary.url(DBNAME), autocommit=True) as conn:
            migrate(conn)
        built.add_standby(synchronous=True)
        built.wait_replayed(built.standbys[0])
        yield built
    finally:
        built.close()


def start_api(processes: Processes, env: dict[str, str] | None = None, timeout: float = 30) -> tuple[Proc, str]:
    """`qforge api` on a free port, once /healthz answers: (process, base URL).

    Other test sessions on this machine start APIs too: a port found free may be taken before
    ours binds it, and then another session's API would answer /healthz. So we wait for our own
    process to say it is listening (or to exit, when it could not bind: then another port)."""
    for _ in range(5):
        port = free_port()
        proc = processes._spawn("api", ["--port", str(port)], env)
        base = f"http://127.0.0.1:{port}"

        def listening() -> bool:
            return not proc.alive() or f"running on {base}" in proc.log()

        wait_for(listening, timeout=timeout, message="the API to listen")
        if not proc.alive():
            continue
        wait_for(lambda: healthy(base), timeout=timeout, message="the API to answer /healthz")
        return proc, base
    raise AssertionError("qforge api could not bind a free port five times")


class RetryingClient:
    """POSTs and GETs that retry 503s and broken connections, as a client of a failing-over API must.

    Retried POSTs carry an idempotency key, so a retry of a write that did commit
    returns the same job (200) instead of making a second one.
    """

    def __init__(self, base: str) -> None:
        self.client = httpx.Client(base_url=base, timeout=30)
        self.retries = 0

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        deadline = time.monotonic() + 60
        while True:
            try:
                response = self.client.request(method, path, **kwargs)
                if response.status_code != 503:
                    return response
            except httpx.TransportError:
                pass
            self.retries += 1
            if time.monotonic() > deadline:
                raise AssertionError(f"{method} {path} kept failing for 60 s")
            time.sleep(0.05)

    def close(self) -> None:
        self.client.close()


def log_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "logs"
    folder.mkdir(exist_ok=True)
    return folder


def start_stack(processes: Processes) -> tuple[Proc, str, list[Proc]]:
    """What a failover test runs on its URL: the API, a monitor and 3 workers of 8 slots."""
    api, base = start_api(processes)
    processes.monitor()
    return api, base, [processes.worker("--concurrency", "8") for _ in range(3)]


class Enqueuer:
    """Client threads that POST jobs `first..last-1` through the API with idempotency keys, retrying
    what a failover makes them retry, optionally at a pace (jobs a second, all threads together);
    `acknowledged` maps each n to the id the API answered with."""

    def __init__(self, base: str, first: int, last: int, *, threads: int = 4, per_second: float | None = None,
                 prefix: str = "failover-job", task: str = "echo") -> None:
        self.base, self.first, self.last, self.prefix, self.task = base, first, last, prefix, task
        self.interval = threads / per_second if per_second else 0.0
        self.acknowledged: dict[int, str] = {}
        self.failures: list[BaseException] = []
        self.clients: list[RetryingClient] = []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(first + part, threads)) for part in range(threads)]
        for thread in self.threads:
            thread.start()

    def _run(self, start: int, step: int) -> None:
        client = RetryingClient(self.base)
        self.clients.append(client)
        try:
            for n in range(start, self.last, step):
                if self.stopping.is_set():
                    return
                response = client.request("POST", "/jobs", json={
                    "task": self.task, "payload": {"n": n}, "idempotency_key": f"{self.prefix}-{n}"})
                assert response.status_code in (200, 201), response.text
                self.acknowledged[n] = response.json()["id"]
                if self.interval:
                    time.sleep(self.interval)
        except Exception as exc:  # reported by the main thread (a thread's exception would be lost)
            if not self.stopping.is_set():
                self.failures.append(exc)

    def join(self, timeout: float = 400) -> None:
        for thread in self.threads:
            thread.join(timeout=timeout)
        assert self.failures == []
        assert len(self.acknowledged) == self.last - self.first

    @property
    def retries(self) -> int:
        return sum(c.retries for c in self.clients)

    def close(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=90)
        for client in self.clients:
            client.close()


def submit_diamonds(client: RetryingClient, prefix: str, count: int) -> list[str]:
    """`count` workflows a -> (b, c) -> d, submitted with idempotency keys; their ids."""
    ids = []
    for n in range(count):
        response = client.request("POST", "/workflows", json={
            "name": f"{prefix}-{n}", "idempotency_key": f"{prefix}-wf-{n}", "steps": [
                {"step": "a", "task": "echo", "payload": {"n": n}},
                {"step": "b", "task": "echo", "depends_on": ["a"]},
                {"step": "c", "task": "echo", "depends_on": ["a"]},
                {"step": "d", "task": "echo", "depends_on": ["b", "c"]}]})
        assert response.status_code in (200, 201), response.text
        ids.append(response.json()["id"])
    return ids


def wait_all_done(url: str, workflows: int, timeout: float = 300) -> None:
    with psycopg.connect(url, autocommit=True) as check:
        def done() -> bool:
            return check.execute("SELECT count(*) FILTER (WHERE status = 'succeeded') = count(*) FROM jobs"
                                 ).fetchone()[0] and check.execute(
                "SELECT count(*) FROM workflows WHERE status = 'succeeded'").fetchone()[0] == workflows

        wait_for(done, timeout=timeout, message="every job and workflow to finish", interval=0.2)


def assert_exactly_once(url: str, acknowledged: dict[int, str], jobs: int, workflows: list[str]) -> list[int]:
    """Every acknowledged job present once and succeeded once, no other job, every workflow succeeded,
    no position twice; returns the log's positions in the order a gapless reader sees them."""
    with psycopg.connect(url, autocommit=True) as check:
        ids = {str(row[0]) for row in check.execute("SELECT id FROM jobs WHERE workflow_id IS NULL")}
        assert set(acknowledged.values()) <= ids, "an acknowledged job is missing"
        assert len(ids) == jobs, "a retried POST made a second job"
        counts = succeeded_counts(check)
        assert set(counts.values()) == {1}, "a job succeeded twice"
        assert {str(i) for i in counts} >= set(acknowledged.values())
        statuses = dict(check.execute("SELECT id::text, status FROM workflows").fetchall())
        assert statuses == {wf: "succeeded" for wf in workflows}
        [(duplicates,)] = check.execute("SELECT count(*) - count(DISTINCT position) FROM events").fetchall()
        assert duplicates == 0
        return [row[0] for row in check.execute("SELECT position FROM events ORDER BY xid, position")]


def first_claim_after(url: str, moment: float) -> float:
    """Seconds from `moment` (time.time()) to the first Claimed event written after it."""
    with psycopg.connect(url, autocommit=True) as check:
        [(first,)] = check.execute("SELECT min(occurred_at) FROM events WHERE type = 'Claimed' AND occurred_at > %s",
                                   (datetime.fromtimestamp(moment, timezone.utc),)).fetchall()
    return first.timestamp() - moment


def received_positions(reader: Any, count: int, timeout: float = 180) -> list[int]:
    """The positions an SSEReader received, until `count` of them or the timeout."""
    received: list[int] = []
    deadline = time.monotonic() + timeout
    while len(received) < count and time.monotonic() < deadline:
        try:
            received.append(reader.messages.get(timeout=1)["json"]["position"])
        except queue.Empty:
            pass
    return received


def replay_verify(url: str) -> None:
    verify = subprocess.run([str(QFORGE), "replay", "--verify", "--database-url", url],
                            capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr
