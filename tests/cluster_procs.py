"""Helpers shared by the failover, standby and partition tests: a PostgreSQL cluster fixture, a
`qforge api` subprocess, and an API client that retries what a failover makes it retry."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import psycopg
import pytest

from pgcluster import Cluster, find_bindir, free_port, server_user
from qforge.migrate import migrate
from test_worker_support import Proc, Processes, wait_for

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


def start_api(processes: Processes, env: dict[str, str] | None = None) -> tuple[Proc, str]:
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

        wait_for(listening, timeout=30, message="the API to listen")
        if not proc.alive():
            continue
        wait_for(lambda: _healthy(base), timeout=30, message="the API to answer /healthz")
        return proc, base
    raise AssertionError("qforge api could not bind a free port five times")


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


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
