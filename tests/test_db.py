"""The migration runner, the CLI's migrate command and the embedded PostgreSQL wrapper."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import types
from pathlib import Path

import psycopg
import pytest

from app import cli
from app.db import (
    EmbeddedPostgres,
    EmbeddedPostgresError,
    connect,
    make_pool,
    resolve_database_url,
    stop_embedded,
    with_database,
)
from app.migrate import migrate, migration_files
from app.settings import Settings


@pytest.fixture
def placeholder_migrations(scratch_dir: Path) -> Path:
    """Three tiny migrations; applying one twice fails (CREATE TABLE) or shows (a second row)."""
    folder = scratch_dir / "migrations"
    folder.mkdir()
    (folder / "0001_first.sql").write_text(
        "CREATE TABLE placeholder_log (name text NOT NULL);\n"
        "SELECT pg_sleep(0.2);  -- widen the race window\n"
        "INSERT INTO placeholder_log VALUES ('0001');\n"
    )
    (folder / "0002_second.sql").write_text(
        "CREATE TABLE placeholder_two (note text DEFAULT '100% {braces}');\n"
        "INSERT INTO placeholder_log VALUES ('0002');\n"
    )
    (folder / "0003_third.sql").write_text("INSERT INTO placeholder_log VALUES ('0003');\n")
    (folder / "README.txt").write_text("not a migration")
    return folder


def _applied_names(url: str) -> list[str]:
    with connect(url) as conn:
        return [name for (name,) in conn.execute("SELECT name FROM schema_migrations ORDER BY name")]


def test_template_records_every_migration_file(conn: psycopg.Connection) -> None:
    rows = conn.execute("SELECT name, applied_at FROM schema_migrations ORDER BY name").fetchall()
    assert [row["name"] for row in rows] == [path.name for path in migration_files()]
    assert all(row["applied_at"] is not None for row in rows)


def test_second_migrate_applies_nothing(conn: psycopg.Connection, db_url: str) -> None:
    before = _applied_names(db_url)
    assert migrate(conn) == []
    assert migrate(conn) == []
    assert _applied_names(db_url) == before


def test_migrate_applies_files_in_order_and_skips_other_files(empty_db_url: str, placeholder_migrations: Path) -> None:
    with connect(empty_db_url) as conn:
        assert migrate(conn, placeholder_migrations) == ["0001_first.sql", "0002_second.sql", "0003_third.sql"]
        assert conn.autocommit is False  # restored
        assert [name for (name,) in conn.execute("SELECT name FROM placeholder_log")] == ["0001", "0002", "0003"]
        conn.rollback()
        assert migrate(conn, placeholder_migrations) == []


def test_concurrent_migrations_apply_each_file_once(empty_db_url: str, placeholder_migrations: Path) -> None:
    barrier = threading.Barrier(2)
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with connect(empty_db_url) as conn:
                barrier.wait(timeout=10)
                results.append(migrate(conn, placeholder_migrations))
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert sorted(results, key=len) == [[], ["0001_first.sql", "0002_second.sql", "0003_third.sql"]]
    with connect(empty_db_url) as conn:
        assert [name for (name,) in conn.execute("SELECT name FROM placeholder_log ORDER BY name")] == [
            "0001",
            "0002",
            "0003",
        ]
    assert _applied_names(empty_db_url) == ["0001_first.sql", "0002_second.sql", "0003_third.sql"]


def test_concurrent_migrations_of_the_real_files_on_a_fresh_database(empty_db_url: str) -> None:
    barrier = threading.Barrier(2)
    results: list[list[str]] = []

    def run() -> None:
        with connect(empty_db_url) as conn:
            barrier.wait(timeout=10)
            results.append(migrate(conn))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    expected = [path.name for path in migration_files()]
    assert len(results) == 2
    assert sorted(results, key=len) == [[], expected] if expected else results == [[], []]
    assert _applied_names(empty_db_url) == expected


def test_failed_migration_is_not_recorded_and_earlier_ones_stay(
    empty_db_url: str, placeholder_migrations: Path
) -> None:
    (placeholder_migrations / "0002_second.sql").write_text(
        "CREATE TABLE half_done (id int);\nSELECT no_such_function();\n"
    )
    with connect(empty_db_url) as conn:
        with pytest.raises(psycopg.errors.UndefinedFunction) as failure:
            migrate(conn, placeholder_migrations)
        assert failure.value.__notes__ == ["while applying migration 0002_second.sql"]
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert conn.execute("SELECT to_regclass('half_done') IS NULL").fetchone() == (True,)
        conn.rollback()
    assert _applied_names(empty_db_url) == ["0001_first.sql"]

    (placeholder_migrations / "0002_second.sql").write_text("CREATE TABLE half_done (id int);\n")
    with connect(empty_db_url) as conn:
        assert migrate(conn, placeholder_migrations) == ["0002_second.sql", "0003_third.sql"]


def test_migrate_refuses_a_connection_inside_a_transaction(empty_db_url: str) -> None:
    with connect(empty_db_url) as conn:
        conn.execute("SELECT 1")
        with pytest.raises(ValueError, match="transaction"):
            migrate(conn)


def test_state_machine_is_installed_on_every_run(
    empty_db_url: str, placeholder_migrations: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bool] = []

    def install_state_machine(conn: psycopg.Connection) -> None:
        calls.append(conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS)

    fake = types.ModuleType("app.events.states")
    fake.install_state_machine = install_state_machine  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "app.events.states", fake)
    with connect(empty_db_url) as conn:
        migrate(conn, placeholder_migrations, sync_state_machine=True)
        migrate(conn, placeholder_migrations, sync_state_machine=True)
        migrate(conn, placeholder_migrations)  # other directories: off by default
    assert calls == [True, True]


def test_cli_migrate_prints_applied_files_then_up_to_date(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--database-url", empty_db_url, "migrate"]) == 0
    first = capsys.readouterr().out.splitlines()
    assert first == [f"applied {path.name}" for path in migration_files()] or first == ["up to date"]
    assert cli.main(["migrate", "--database-url", empty_db_url]) == 0
    assert capsys.readouterr().out.splitlines() == ["up to date"]


def test_cli_subcommand_whose_module_is_missing_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = cli.Subcommand("ghost", "not built", "app.no_such_module:cli_main")
    monkeypatch.setattr(cli, "SUBCOMMANDS", [*cli.SUBCOMMANDS, missing])
    assert cli.main(["ghost"]) == 2
    assert "app.no_such_module:cli_main" in capsys.readouterr().err


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
