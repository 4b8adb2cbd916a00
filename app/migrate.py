"""Apply the numbered SQL files in migrations/ once each, safely from many processes at once."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"

# Fixed key of the session advisory lock that serialises migration runners
# ("QForge" in ASCII plus 1); any value works as long as it never changes.
MIGRATION_LOCK_KEY = 0x5146_6F72_6765_0001

_MIGRATION_FILE = re.compile(r"^\d{4}_[A-Za-z0-9_\-]+\.sql$")


def migration_files(directory: Path | None = None) -> list[Path]:
    """The migration files (``NNNN_name.sql``) in the order they apply."""
    directory = MIGRATIONS_DIR if directory is None else Path(directory)
    if not directory.is_dir():
        return []
    return sorted(path for path in directory.iterdir() if _MIGRATION_FILE.match(path.name))


def migrate(
    conn: psycopg.Connection, directory: Path | None = None, *, sync_state_machine: bool | None = None
) -> list[str]:
    """Apply the pending migration files and return their names (empty when up to date).

    Each file runs in its own transaction together with its row in
    ``schema_migrations``, so a failing file leaves the ones before it applied
    and itself not at all. A session advisory lock makes concurrent runners
    take turns; the second one finds nothing to do. Afterwards (every run,
    under the same lock) the state machine table is synced from Python;
    ``sync_state_machine`` defaults to doing so only for the project's own
    migrations directory, whose schema has that table.

    ``conn`` must not be inside a transaction; its autocommit setting is
    restored on return. Files must not need to run outside a transaction
    (no ``CREATE INDEX CONCURRENTLY``).
    """
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise ValueError("migrate() needs a connection that is not inside a transaction")
    files = migration_files(directory)
    if sync_state_machine is None:
        sync_state_machine = directory is None or Path(directory).resolve() == MIGRATIONS_DIR
    was_autocommit = conn.autocommit
    conn.autocommit = True
    try:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            return _apply_pending(conn, files, sync_state_machine)
        finally:
            if not conn.closed:  # a lost connection has released the lock already
                conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    finally:
        if not conn.closed:
            conn.autocommit = was_autocommit


def _apply_pending(conn: psycopg.Connection, files: list[Path], sync_state_machine: bool) -> list[str]:
    with conn.transaction():
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " name text PRIMARY KEY,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
    with conn.cursor(row_factory=tuple_row) as cur:  # whatever row factory the caller's connection uses
        applied = {name for (name,) in cur.execute("SELECT name FROM schema_migrations")}
    newly_applied: list[str] = []
    for path in files:
        if path.name in applied:
            continue
        try:
            with conn.transaction():
                # A whole file is one simple-protocol query (no parameters), so
                # it may hold many statements and literal % signs.
                conn.execute(sql.SQL(path.read_text(encoding="utf-8")))  # type: ignore[arg-type]
                conn.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (path.name,))
        except psycopg.Error as exc:
            exc.add_note(f"while applying migration {path.name}")
            raise
        newly_applied.append(path.name)
    if sync_state_machine:
        _install_state_machine(conn)
    return newly_applied


def _install_state_machine(conn: psycopg.Connection) -> None:
    """Sync the Python transition table into the database, once app.events.states exists.

    Called inside a transaction: the installer must not commit.
    """
    try:
        states = importlib.import_module("app.events.states")
    except ModuleNotFoundError as exc:
        if exc.name in ("app.events", "app.events.states"):
            return  # not written yet
        raise
    install = getattr(states, "install_state_machine", None)
    if install is None:
        return
    with conn.transaction():
        install(conn)
