"""Shared fixtures: one real PostgreSQL per session, one migrated template, a fresh database per test.

The server comes from the first of:
1. ``QFORGE_TEST_DATABASE_URL`` (an admin URL: it must be allowed to create databases);
2. Docker, through testcontainers (skipped quickly when no engine answers);
3. the embedded PostgreSQL, in a fresh temp dir that is deleted at the end.
"""

from __future__ import annotations

import gc
import os
import secrets
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from qforge.db import THROWAWAY_CONFIG, EmbeddedPostgres, connect, with_database
from qforge.migrate import migrate

TEST_DATABASE_URL_ENV = "QFORGE_TEST_DATABASE_URL"
DOCKER_IMAGE = "postgres:16-alpine"


def _docker_postgres() -> Iterator[str] | None:
    """A generator yielding a fresh container's URL, or None when Docker is not usable here."""
    with warnings.catch_warnings():
        # docker-py leaves its socket to the garbage collector when no engine
        # answers; collect it here, where its ResourceWarning is ignored.
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            from testcontainers.community.postgres import PostgresContainer

            container = PostgresContainer(DOCKER_IMAGE, driver=None, docker_client_kw={"timeout": 2})
        except Exception:  # docker.errors.DockerException: no engine (fails in well under a second)
            container = None
        gc.collect()
    if container is None:
        return None
    try:
        container.start()
    except Exception:  # an engine that cannot pull or run the image: fall through to the next provider
        try:
            container.stop()
        except Exception:
            pass
        return None

    def run() -> Iterator[str]:
        try:
            yield container.get_connection_url()
        finally:
            container.stop()

    return run()


def fast_temp_base() -> str:
    """Where throwaway clusters and scratch folders go: tmpfs when it has room.

    Creating a file on this machine's ext4 root can take ~1 ms (CREATE
    DATABASE makes ~300 of them: 0.25 s on disk, 0.013 s on /dev/shm). Never
    under /root: as root the server runs as another user.
    """
    shm = Path("/dev/shm")
    try:
        stats = os.statvfs(shm)
        if os.access(shm, os.W_OK) and stats.f_bavail * stats.f_frsize > 2 * 1024**3:
            return str(shm)
    except OSError:
        pass
    base = tempfile.gettempdir()
    return "/var/tmp" if Path(base).resolve().is_relative_to("/root") else base


def _embedded_postgres() -> Iterator[str]:
    # A fresh folder every session: no reuse surprises from a killed earlier run.
    folder = Path(tempfile.mkdtemp(prefix="qforge-test-", dir=fast_temp_base()))
    server = EmbeddedPostgres()
    try:
        yield server.start(folder / "pgdata", cleanup_mode="delete", config=THROWAWAY_CONFIG)
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def scratch_dir() -> Iterator[Path]:
    """A fresh folder, removed afterwards; fit for an embedded data directory (unlike tmp_path, which
    pytest keeps mode 0700 and which lives on the slow disk)."""
    folder = Path(tempfile.mkdtemp(prefix="qforge-scratch-", dir=fast_temp_base()))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """Admin URL of the session's PostgreSQL server."""
    explicit = os.environ.get(TEST_DATABASE_URL_ENV)
    if explicit:
        yield explicit
        return
    provider = _docker_postgres() or _embedded_postgres()
    yield from provider


def _create_database(admin_url: str, name: str, template: str | None = None) -> None:
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
    with connect(admin_url, autocommit=True) as admin:
        admin.execute(statement)


def _drop_database(admin_url: str, name: str) -> None:
    with connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def template_database(server_url: str) -> Iterator[str]:
    """Name of a database migrated once per session, cloned by every test."""
    name = f"qf_template_{secrets.token_hex(4)}"
    _create_database(server_url, name)
    try:
        with connect(with_database(server_url, name), autocommit=True) as conn:
            migrate(conn)
        yield name
    finally:
        _drop_database(server_url, name)


@pytest.fixture
def db_url(server_url: str, template_database: str) -> Iterator[str]:
    """URL of a fresh, migrated database of this test alone (dropped afterwards)."""
    name = f"t_{secrets.token_hex(6)}"
    _create_database(server_url, name, template=template_database)
    try:
        yield with_database(server_url, name)
    finally:
        _drop_database(server_url, name)


@pytest.fixture
def empty_db_url(server_url: str) -> Iterator[str]:
    """URL of a fresh database with no schema at all (dropped afterwards)."""
    name = f"e_{secrets.token_hex(6)}"
    _create_database(server_url, name)
    try:
        yield with_database(server_url, name)
    finally:
        _drop_database(server_url, name)


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    """A dict-row connection to this test's database, in autocommit mode.

    Autocommit so that every ``with conn.transaction():`` is a real
    transaction (not a savepoint inside an implicit one) and other connections
    see what a test wrote.
    """
    with connect(db_url, autocommit=True, row_factory=dict_row) as connection:
        yield connection


ORACLE_SQL = Path(__file__).parent / "oracle_fold.sql"


@pytest.fixture
def oracle(conn: psycopg.Connection) -> psycopg.Connection:
    """`conn`, with the row-by-row test oracle of the fold installed (tests/oracle_fold.sql)."""
    conn.execute(sql.SQL(ORACLE_SQL.read_text()))  # type: ignore[arg-type]
    return conn


@pytest.fixture(scope="session")
def remote(server_url: str, template_database: str):
    """One real `qforge api` for the whole session, with an admin token (tests/remote_support.py)."""
    from remote_support import shared_api

    yield from shared_api(server_url, template_database)
