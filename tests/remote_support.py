"""One real `qforge api` subprocess for the test session, on a database of its own, with an admin
token: for the tests that reach the system the way a user does (the client, the `qforge` commands
over the API). Starting the API costs seconds on a busy machine, so it is started once (by the
first test that asks); the tests keep apart by their own queues, tasks, tags and names."""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from cluster_procs import start_api
from qforge.commands import tokens
from qforge.db import connect, with_database
from test_worker_support import QFORGE, TEST_TASKS, Processes


def _create_database(admin_url: str, name: str, template: str) -> None:
    # the recipe of tests/conftest.py's db_url (whose helpers a module cannot import by name:
    # tests/browser/ has a conftest module too)
    with connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name),
                                                                       sql.Identifier(template)))


def _drop_database(admin_url: str, name: str) -> None:
    with connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@dataclass
class Remote:
    base: str
    db_url: str
    token: str  # admin
    processes: Processes

    def http(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=120,
                            headers={"Authorization": f"Bearer {token or self.token}"})

    def qforge(self, *args: str, token: str | None = "admin", timeout: float = 120,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """The real `qforge` command against this API (`token=None`: without QFORGE_API_TOKEN)."""
        full_env = {k: v for k, v in os.environ.items() if k not in ("QFORGE_API_TOKEN", "QFORGE_API_URL")}
        if token:
            full_env["QFORGE_API_TOKEN"] = self.token if token == "admin" else token
        full_env.update(env or {})
        return subprocess.run([str(QFORGE), *args, "--api-url", self.base], capture_output=True, text=True,
                              env=full_env, timeout=timeout)


@dataclass
class Ran:
    """What a command run in this process printed, shaped as subprocess.run's answer."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(remote: Remote, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """`cli(*args, token="admin")`: `qforge ARGS --api-url <the shared API>` run by qforge.cli.main in
    this process (the very code of the console script, without a Python start per call, which
    costs seconds on a busy machine); remote.qforge runs the real executable."""
    from qforge.cli import main

    def run(*args: str, token: str | None = "admin") -> Ran:
        monkeypatch.delenv("QFORGE_API_URL", raising=False)
        if token:
            monkeypatch.setenv("QFORGE_API_TOKEN", remote.token if token == "admin" else token)
        else:
            monkeypatch.delenv("QFORGE_API_TOKEN", raising=False)
        capsys.readouterr()
        code = main([*args, "--api-url", remote.base])
        out = capsys.readouterr()
        return Ran(args, code, out.out, out.err)
    return run


def shared_api(server_url: str, template_database: str) -> Iterator[Remote]:
    """The session's Remote (the `remote` fixture of tests/conftest.py: a fixture imported into
    several modules would be one fixture per module, and start an API each)."""
    name = f"m_{secrets.token_hex(6)}"
    _create_database(server_url, name, template=template_database)
    db_url = with_database(server_url, name)
    folder = Path(tempfile.mkdtemp(prefix="qforge-remote-"))
    (folder / "tasks").mkdir()
    (folder / "tasks" / "qf_test_tasks.py").write_text(TEST_TASKS)
    processes = Processes(db_url, folder, folder / "tasks")
    try:
        with connect(db_url, autocommit=True) as conn:
            token = tokens.create_token(conn, "admin-of-tests", "admin", actor="test")
        _, base = start_api(processes)
        yield Remote(base, db_url, token, processes)
    finally:
        processes.close()
        _drop_database(server_url, name)


@pytest.fixture
def rconn(remote: Remote) -> Iterator[psycopg.Connection]:
    """A dict-row autocommit connection to the shared API's database."""
    with connect(remote.db_url, autocommit=True, row_factory=dict_row) as connection:
        yield connection


@pytest.fixture
def api(remote: Remote) -> Iterator[httpx.Client]:
    """An HTTP client of the shared API, with the admin token."""
    with remote.http() as client:
        yield client
