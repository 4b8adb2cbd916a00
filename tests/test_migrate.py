"""The schema runner: checksummed versioned migrations, repeatable definitions, drift refused everywhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from importlib import resources
from pathlib import Path

import psycopg
import pytest

from qforge import cli, migrate as runner
from qforge.db import connect
from qforge.migrate import SchemaDrift, load_source, migrate, status
from test_worker_support import wait_for


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


@pytest.fixture
def schema_copy(scratch_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch copy of the package's schema files, which the runner (and the CLI in this
    process) use instead of the package's own."""
    folder = scratch_dir / "schema"
    shutil.copytree(str(resources.files("qforge.migrations")), folder,
                    ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))
    monkeypatch.setattr(runner, "SCHEMA_DIRECTORY", folder)
    return folder


def _recorded(url: str) -> dict[str, str]:
    with connect(url) as conn:
        return dict(conn.execute("SELECT name, checksum FROM schema_migrations ORDER BY name").fetchall())


def test_template_records_every_file_with_its_checksum(db_url: str) -> None:
    expected = {f.name: f.checksum for f in load_source().all()}
    assert _recorded(db_url) == expected


def test_second_migrate_applies_nothing(conn: psycopg.Connection, db_url: str) -> None:
    before = _recorded(db_url)
    assert migrate(conn) == []
    assert migrate(conn) == []
    assert _recorded(db_url) == before
    assert status(conn).current


def test_migrate_applies_files_in_order_and_skips_other_files(empty_db_url: str,
                                                              placeholder_migrations: Path) -> None:
    with connect(empty_db_url) as conn:
        assert migrate(conn, placeholder_migrations) == ["0001_first.sql", "0002_second.sql", "0003_third.sql"]
        assert conn.autocommit is False  # restored
        assert [name for (name,) in conn.execute("SELECT name FROM placeholder_log")] == ["0001", "0002", "0003"]
        conn.rollback()
        assert migrate(conn, placeholder_migrations) == []


def test_a_failing_file_applies_nothing_of_the_upgrade(empty_db_url: str, placeholder_migrations: Path) -> None:
    (placeholder_migrations / "0002_second.sql").write_text(
        "CREATE TABLE half_done (id int);\nSELECT no_such_function();\n")
    with connect(empty_db_url) as conn:
        with pytest.raises(psycopg.errors.UndefinedFunction) as failure:
            migrate(conn, placeholder_migrations)
        assert failure.value.__notes__ == ["while applying 0002_second.sql"]
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        # One transaction for the whole upgrade: not even 0001 is there.
        assert conn.execute("SELECT to_regclass('placeholder_log') IS NULL").fetchone() == (True,)
        conn.rollback()
    (placeholder_migrations / "0002_second.sql").write_text("CREATE TABLE half_done (id int);\n")
    with connect(empty_db_url) as conn:
        assert migrate(conn, placeholder_migrations) == ["0001_first.sql", "0002_second.sql", "0003_third.sql"]


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
        assert [n for (n,) in conn.execute("SELECT name FROM placeholder_log ORDER BY name")] == [
            "0001", "0002", "0003"]


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
    expected = [f.name for f in load_source().all()]
    assert sorted(results, key=len) == [[], expected]


def test_migrate_refuses_a_connection_inside_a_transaction(empty_db_url: str) -> None:
    with connect(empty_db_url) as conn:
        conn.execute("SELECT 1")
        with pytest.raises(ValueError, match="transaction"):
            migrate(conn)


def test_an_edited_applied_migration_is_refused_naming_the_file(
        empty_db_url: str, schema_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--database-url", empty_db_url, "migrate"]) == 0
    capsys.readouterr()
    edited = schema_copy / "0003_workers.sql"
    edited.write_text(edited.read_text() + "\nCREATE INDEX workers_by_host ON workers (host);\n")

    assert cli.main(["--database-url", empty_db_url, "migrate"]) == 1
    err = capsys.readouterr().err
    assert "0003_workers.sql" in err and "edited" in err
    with connect(empty_db_url) as conn:  # nothing of the edit was applied
        assert conn.execute("SELECT to_regclass('workers_by_host')").fetchone() == (None,)

    assert cli.main(["--database-url", empty_db_url, "migrate", "--status"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("changed") and "0003_workers.sql" in line for line in lines)


def test_renamed_missing_and_newer_files_are_refused(empty_db_url: str, schema_copy: Path) -> None:
    with connect(empty_db_url, autocommit=True) as conn:
        migrate(conn)
        (schema_copy / "0004_large_tables.sql").rename(schema_copy / "0004_big_tables.sql")
        with pytest.raises(SchemaDrift, match="0004_large_tables.sql: applied under another name"):
            migrate(conn)
        (schema_copy / "0004_big_tables.sql").unlink()
        with pytest.raises(SchemaDrift, match="0004_large_tables.sql: applied, but this code has no such file"):
            migrate(conn)
        shutil.copy(str(resources.files("qforge.migrations") / "0004_large_tables.sql"), schema_copy)
        conn.execute("INSERT INTO schema_migrations (name, checksum) VALUES ('9999_from_the_future.sql', 'x')")
        with pytest.raises(SchemaDrift, match="9999_from_the_future.sql: applied by newer code") as refused:
            migrate(conn)
        assert "newer QForge" in str(refused.value)


def test_a_changed_definition_is_applied_again_not_refused(empty_db_url: str, schema_copy: Path) -> None:
    with connect(empty_db_url, autocommit=True) as conn:
        migrate(conn)
        definition = schema_copy / "definitions" / "40_jobs.sql"
        definition.write_text(definition.read_text() + (
            "\nCREATE OR REPLACE FUNCTION qforge_probe() RETURNS int LANGUAGE sql AS $$ SELECT 7 $$;\n"))
        assert [f.state for f in status(conn).files if f.name == "definitions/40_jobs.sql"] == ["stale"]
        assert migrate(conn) == ["definitions/40_jobs.sql"]
        assert conn.execute("SELECT qforge_probe()").fetchone() == (7,)
        assert status(conn).current


def _qforge(*args: str, url: str, timeout: float = 30) -> subprocess.CompletedProcess:
    env = {**os.environ, "QFORGE_DATABASE_URL": url}
    return subprocess.run([sys.executable, "-m", "qforge.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("command", [["worker"], ["monitor"], ["api", "--port", "0"]])
def test_every_process_refuses_to_start_on_a_changed_migration(db_url: str, command: list[str]) -> None:
    with connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE schema_migrations SET checksum = repeat('0', 64) WHERE name = '0002_projections.sql'")
    result = _qforge(*command, url=db_url)
    assert result.returncode == 1, result.stderr
    assert "0002_projections.sql" in result.stderr and "edited" in result.stderr


def test_a_worker_waits_for_pending_migrations_then_runs(empty_db_url: str) -> None:
    env = {**os.environ, "QFORGE_DATABASE_URL": empty_db_url}
    worker = subprocess.Popen([sys.executable, "-m", "qforge.cli", "worker", "--name", "patient"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(worker.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("needs `qforge migrate`" in line for line in lines), timeout=30,
                 message="the worker to say it waits for migrations")
        assert worker.poll() is None
        with connect(empty_db_url, autocommit=True) as conn:
            migrate(conn)
            wait_for(lambda: conn.execute("SELECT count(*) FROM workers WHERE name = 'patient'").fetchone()[0],
                     timeout=30, message="the worker to register once migrated")
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        reader.join(timeout=5)
        worker.stdout.close()
