"""The command line's parser, connections and pools, and the embedded PostgreSQL wrapper."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psycopg
import pytest

from qforge import cli
from qforge.db import (
    EmbeddedPostgres,
    EmbeddedPostgresError,
    connect,
    make_pool,
    resolve_database_url,
    stop_embedded,
    with_database,
)
from qforge.settings import Settings


def test_cli_parses_the_contract_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QFORGE_PORT", "9999")
    parser = cli.build_parser()
    worker = parser.parse_args(["worker", "--queues", "default,emails", "--concurrency", "3", "--allow-shell"])
    assert (worker.queues, worker.concurrency, worker.tasks, worker.name, worker.allow_shell) == (
        "default,emails",
        3,
        "",
        None,
        True,
    )
    assert cli.split_csv(worker.queues) == ["default", "emails"]
    api = parser.parse_args(["--database-url", "postgresql://x/y", "api"])
    cli._fill_from_settings(api)
    assert (api.host, api.port, api.database_url) == ("127.0.0.1", 9999, "postgresql://x/y")
    replay = parser.parse_args(["replay", "--verify", "--as-of", "42"])
    assert (replay.verify, replay.as_of, replay.as_of_time) == (True, 42, None)
    with pytest.raises(SystemExit):
        parser.parse_args(["replay", "--as-of", "1", "--as-of-time", "2024-01-01T00:00:00Z"])
    assert parser.parse_args(["demo"]).api_url == "http://127.0.0.1:8090"


def test_connect_defaults_to_transactions(db_url: str) -> None:
    with connect(db_url) as conn:
        assert conn.autocommit is False
        conn.execute("SELECT 1")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS


def test_worker_connections_read_json_exactly_as_json_loads_does(db_url: str) -> None:
    import json

    from qforge.workers.connection import connect as worker_connect

    values = ['{}', '{"n": 123456789012345678901234567890, "f": 1.5e300, "s": "\\u00e9\\u2028 \\"q\\""}',
              '[1, {"a": [null, true, false]}]', '"text"', '12.50', 'null', '{"": {}}']
    with worker_connect(db_url, "test-json") as conn:
        for text in values:
            for cast in ("json", "jsonb"):
                canonical = conn.execute(f"SELECT %s::{cast}::text", (text,)).fetchone()[0]
                got = conn.execute(f"SELECT %s::{cast}", (text,)).fetchone()[0]
                assert got == json.loads(canonical) and type(got) is type(json.loads(canonical)), (cast, text)
        first, second = conn.execute("SELECT '{}'::jsonb, '{}'::jsonb").fetchone()
        first["changed"] = True
        assert second == {}  # every empty object is a new dict: a task may change its payload


def test_pools_open_ready_and_pass_connection_options(db_url: str) -> None:
    from psycopg.rows import dict_row

    with make_pool(db_url, min_size=2, max_size=3, row_factory=dict_row) as pool:
        assert pool.get_stats()["pool_available"] == 2
        with pool.connection() as conn:
            assert conn.execute("SELECT 7 AS n").fetchone() == {"n": 7}


def test_with_database_rewrites_urls_and_keyword_strings() -> None:
    assert (
        with_database("postgresql://postgres:@/postgres?host=/tmp/x/pgdata", "t_1")
        == "postgresql://postgres:@/t_1?host=/tmp/x/pgdata"
    )
    assert with_database("postgresql://u:p@127.0.0.1:5432/db", "other") == "postgresql://u:p@127.0.0.1:5432/other"
    assert psycopg.conninfo.conninfo_to_dict(with_database("host=h dbname=a user=u", "b")) == {
        "host": "h",
        "dbname": "b",
        "user": "u",
    }


def test_resolve_database_url_prefers_explicit_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QFORGE_DATABASE_URL", "postgresql://from-env/db")
    assert resolve_database_url() == "postgresql://from-env/db"
    assert resolve_database_url("postgresql://explicit/db") == "postgresql://explicit/db"


def test_resolve_database_url_starts_the_embedded_server_in_the_data_dir(
    scratch_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QFORGE_DATABASE_URL", raising=False)
    settings = Settings(data_dir=str(scratch_dir / "state"))
    try:
        url = resolve_database_url(settings=settings)
        assert resolve_database_url(settings=settings) == url  # attached once per process
        assert (scratch_dir / "state" / "pgdata" / "PG_VERSION").exists()
        with connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        stop_embedded()
    assert not (scratch_dir / "state" / "pgdata" / "postmaster.pid").exists()  # stopped: we were its only user


@pytest.mark.skipif(os.geteuid() != 0, reason="only root is refused a data directory under /root")
def test_embedded_data_under_root_home_is_refused() -> None:
    with pytest.raises(EmbeddedPostgresError, match="/root"):
        EmbeddedPostgres().start("/root/qforge-should-not-exist/pgdata")
    assert not Path("/root/qforge-should-not-exist").exists()


def test_embedded_server_recovers_when_its_pid_file_names_another_live_process(scratch_dir: Path) -> None:
    # What a reboot or a SIGKILL can leave: postmaster.pid naming a pid that
    # now belongs to an unrelated process, so the wheel thinks the server runs.
    pgdata = scratch_dir / "pgdata"
    first = EmbeddedPostgres()
    first.start(pgdata, cleanup_mode="delete")
    pid_file = pgdata / "postmaster.pid"
    lines = pid_file.read_text().splitlines()
    os.kill(int(lines[0]), signal.SIGKILL)
    _wait_until_gone(int(lines[0]))
    lines[0] = str(os.getpid())  # alive, and not a postgres
    pid_file.write_text("\n".join(lines) + "\n")

    second = EmbeddedPostgres()
    try:
        url = second.start(pgdata, cleanup_mode="delete", timeout_seconds=30)
        with connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        first.stop()
        second.stop()
    assert not pgdata.exists()


def _wait_until_gone(pid: int, timeout: float = 10.0) -> None:
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return  # dead; only its parent's reaping is missing
        except psutil.NoSuchProcess:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still alive after {timeout} s")
