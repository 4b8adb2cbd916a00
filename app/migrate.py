"""The schema runner: versioned migrations applied once and never edited, repeatable definitions kept current.

Two kinds of files, both under the ``migrations`` folder of the package:

- Versioned migrations, ``NNNN_name.sql``: tables, columns, indexes, data
  changes. Each is applied once, and its SHA-256 is recorded. Once released a
  file is never edited or renamed: every process that starts against the
  database compares the recorded checksums with its own files and refuses to
  run when an applied file changed, was renamed or is missing, or when the
  database holds migrations this code does not know (a newer schema).
- Repeatable definitions, ``definitions/NN_area.sql``: functions, triggers and
  views (the fold, the projection trigger, the state machine's lookups). They
  are written to be applied again at any time (CREATE OR REPLACE ...), and they
  are: whenever any of their checksums differs from the recorded ones, all of
  them are applied again, in file order, after the versioned files. The state
  machine of ``qforge.events.states`` is one more definition, generated from
  Python.

Everything pending is applied in ONE transaction, under a session advisory
lock: an upgrade either happens whole or not at all, a second runner waits and
then finds nothing to do, and no process ever sees new tables with old
functions.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Iterable

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from qforge.events.states import state_machine_definition
from qforge.settings import get_settings
from qforge.sql import q

# Fixed key of the session advisory lock that serialises migration runners
# ("QForge" in ASCII plus 1); any value works as long as it never changes.
MIGRATION_LOCK_KEY = 0x5146_6F72_6765_0001

VERSIONED = "versioned"
DEFINITION = "definition"
DEFINITIONS_FOLDER = "definitions"
GENERATED_STATE_MACHINE = "definitions/state_machine (generated)"

_VERSIONED_FILE = re.compile(r"^(\d{4})_[A-Za-z0-9_\-]+\.sql$")
_DEFINITION_FILE = re.compile(r"^\d{2}_[A-Za-z0-9_\-]+\.sql$")

# Versioned files renamed before checksums existed (before 0.1.0 shipped): a
# database that recorded the old name applied the same migration.
LEGACY_NAMES = {"0004_autovacuum.sql": "0004_large_tables.sql"}


@dataclass(frozen=True)
class SchemaFile:
    """One file of the schema (or the generated state machine) with its checksum."""

    name: str  # "0001_events.sql" or "definitions/20_fold.sql"
    kind: str  # VERSIONED | DEFINITION
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Source:
    """The schema this code expects: versioned files in order, then definitions in order."""

    versioned: tuple[SchemaFile, ...]
    definitions: tuple[SchemaFile, ...]

    def all(self) -> tuple[SchemaFile, ...]:
        return self.versioned + self.definitions


# Where the package's own schema files are; None: inside the installed package.
# Tests point it at a scratch copy to show what an edited file does.
SCHEMA_DIRECTORY: Path | None = None


def load_source(directory: Path | str | None = None, *, state_machine: bool | None = None) -> Source:
    """The schema files of `directory` (default: the package's own migrations).

    The generated state machine is one of the definitions for the package's own
    schema (and wherever `state_machine=True`).
    """
    if state_machine is None:
        state_machine = directory is None
    directory = directory if directory is not None else SCHEMA_DIRECTORY
    folder = resources.files("qforge.migrations") if directory is None else Path(directory)
    versioned = tuple(
        SchemaFile(entry.name, VERSIONED, entry.read_text(encoding="utf-8"))
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.is_file() and _VERSIONED_FILE.match(entry.name))
    definitions: list[SchemaFile] = []
    if state_machine:
        definitions.append(SchemaFile(GENERATED_STATE_MACHINE, DEFINITION, state_machine_definition()))
    sub = folder / DEFINITIONS_FOLDER
    if sub.is_dir():
        definitions += [
            SchemaFile(f"{DEFINITIONS_FOLDER}/{entry.name}", DEFINITION, entry.read_text(encoding="utf-8"))
            for entry in sorted(sub.iterdir(), key=lambda e: e.name)
            if entry.is_file() and _DEFINITION_FILE.match(entry.name)]
    return Source(versioned, tuple(definitions))


# ---------------------------------------------------------------------------
# status


@dataclass(frozen=True)
class FileState:
    """Where one schema file stands in a database."""

    name: str
    kind: str
    state: str  # see STATES
    applied_at: datetime | None = None
    detail: str = ""


STATES = {
    # versioned files
    "applied": "applied, unchanged",
    "pending": "not applied yet",
    "changed": "applied, but the file was edited since",
    "renamed": "applied under another name",
    "missing": "applied, but this code has no such file",
    "unknown": "applied by newer code: this code does not know it",
    # definitions
    "current": "applied, unchanged",
    "stale": "will be applied again (the file changed)",
    "new": "not applied yet",
    "removed": "applied, no longer defined (its objects stay until a migration drops them)",
}
DRIFT = frozenset({"changed", "renamed", "missing", "unknown"})
TO_APPLY = frozenset({"pending", "stale", "new", "removed"})


@dataclass
class SchemaStatus:
    files: list[FileState] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)  # legacy rows that will be given checksums

    @property
    def drift(self) -> list[FileState]:
        return [f for f in self.files if f.state in DRIFT]

    @property
    def to_apply(self) -> list[FileState]:
        return [f for f in self.files if f.state in TO_APPLY]

    @property
    def current(self) -> bool:
        return not self.drift and not self.to_apply


class SchemaError(Exception):
    """The database's schema is not the one this code was written for."""


class SchemaDrift(SchemaError):
    """Applied migrations differ from this code's files: running would corrupt data or fail later."""

    def __init__(self, drift: list[FileState]):
        lines = [f"  {f.name}: {STATES[f.state]}" + (f" ({f.detail})" if f.detail else "") for f in drift]
        advice = ("Released migration files are never edited or renamed; restore the file as released, "
                  "or run the code that matches this database")
        if any(f.state == "unknown" for f in drift):
            advice = "The database was migrated by a newer QForge; run that version (or newer)"
        super().__init__("the database schema does not match this code:\n" + "\n".join(lines) + f"\n{advice}.")
        self.drift = drift


class SchemaPending(SchemaError):
    """Migrations or definitions wait to be applied (`qforge migrate`)."""

    def __init__(self, pending: list[FileState]):
        names = ", ".join(f.name for f in pending)
        super().__init__(f"the database needs `qforge migrate`: {len(pending)} file(s) to apply ({names})")
        self.pending = pending


def _recorded(conn: psycopg.Connection) -> list[dict] | None:
    """The rows of schema_migrations, or None when the table does not exist (an empty database)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("schema_table_exists"))
        if not cur.fetchone()["present"]:
            return None
        cur.execute(q("schema_table_has_checksums"))
        if cur.fetchone()["present"]:
            cur.execute(q("schema_recorded"))
        else:  # 0.1.0 recorded names only
            cur.execute(q("schema_recorded_legacy"))
        return cur.fetchall()


def status(conn: psycopg.Connection, source: Source | None = None) -> SchemaStatus:
    """Compare the database's record with the files of `source` (read-only)."""
    source = source or load_source()
    rows = _recorded(conn) or []
    report = SchemaStatus()
    recorded = {row["name"]: row for row in rows}
    known = {f.name: f for f in source.all()}
    by_checksum = {f.checksum: f for f in source.versioned}
    newest_known = max((f.name for f in source.versioned), default="")

    for legacy, current in LEGACY_NAMES.items():  # a pre-release rename: same migration
        if legacy in recorded and current not in recorded and current in known:
            row = recorded.pop(legacy)
            recorded[current] = {**row, "name": current, "checksum": None, "legacy_name": legacy}

    for schema_file in source.versioned:
        row = recorded.pop(schema_file.name, None)
        if row is None:
            report.files.append(FileState(schema_file.name, VERSIONED, "pending"))
        elif row["checksum"] is None:  # recorded before checksums: adopt the released file
            report.adopted.append(schema_file.name)
            report.files.append(FileState(schema_file.name, VERSIONED, "applied", row["applied_at"],
                                          "recorded before checksums; adopted"))
        elif row["checksum"] != schema_file.checksum:
            report.files.append(FileState(schema_file.name, VERSIONED, "changed", row["applied_at"],
                                          f"recorded sha256 {row['checksum'][:12]}…, file "
                                          f"{schema_file.checksum[:12]}…"))
        else:
            report.files.append(FileState(schema_file.name, VERSIONED, "applied", row["applied_at"]))

    for schema_file in source.definitions:
        row = recorded.pop(schema_file.name, None)
        if row is None:
            report.files.append(FileState(schema_file.name, DEFINITION, "new"))
        elif row["checksum"] != schema_file.checksum:
            report.files.append(FileState(schema_file.name, DEFINITION, "stale", row["applied_at"]))
        else:
            report.files.append(FileState(schema_file.name, DEFINITION, "current", row["applied_at"]))

    for name, row in sorted(recorded.items()):  # applied, but not among this code's files
        if row["kind"] == DEFINITION:
            report.files.append(FileState(name, DEFINITION, "removed", row["applied_at"]))
            continue
        twin = by_checksum.get(row["checksum"]) if row["checksum"] else None
        if twin is not None:
            report.files.append(FileState(name, VERSIONED, "renamed", row["applied_at"],
                                          f"the same file is now named {twin.name}"))
        elif name > newest_known:
            report.files.append(FileState(name, VERSIONED, "unknown", row["applied_at"]))
        else:
            report.files.append(FileState(name, VERSIONED, "missing", row["applied_at"]))
    return report


# ---------------------------------------------------------------------------
# migrate


def migrate(conn: psycopg.Connection, source: Source | Path | str | None = None, *,
            role_prefix: str | None = None) -> list[str]:
    """Apply what is pending and return the names applied (empty when up to date).

    Then, every time, make the processes' roles and their privileges what
    definitions/90_roles.sql says (roles_apply(), in the same transaction), for
    the roles named `role_prefix` (default: the setting QFORGE_ROLE_PREFIX).

    Raises SchemaDrift, and applies nothing, when applied files changed, were
    renamed or are missing, or the database is newer than this code.
    `conn` must not be inside a transaction; its autocommit setting is restored.
    Files must not need to run outside a transaction (no CREATE INDEX CONCURRENTLY).
    """
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise ValueError("migrate() needs a connection that is not inside a transaction")
    if not isinstance(source, Source):
        source = load_source(source)
    was_autocommit = conn.autocommit
    conn.autocommit = True
    try:
        conn.execute(q("schema_lock"), {"key": MIGRATION_LOCK_KEY})
        try:
            return _apply(conn, source, role_prefix or get_settings().role_prefix)
        finally:
            if not conn.closed:  # a lost connection has released the lock already
                conn.execute(q("schema_unlock"), {"key": MIGRATION_LOCK_KEY})
    finally:
        if not conn.closed:
            conn.autocommit = was_autocommit


def _apply(conn: psycopg.Connection, source: Source, role_prefix: str) -> list[str]:
    with conn.transaction():
        conn.execute(sql.SQL(q("schema_bootstrap")))  # type: ignore[arg-type]
        report = status(conn, source)
        if report.drift:
            raise SchemaDrift(report.drift)
        for legacy, current in LEGACY_NAMES.items():
            conn.execute(q("schema_rename_legacy"), {"old": legacy, "new": current})
        for name in report.adopted:
            conn.execute(q("schema_adopt"), {"name": name, "checksum": _file(source, name).checksum})
        applied: list[str] = []
        for state in report.files:
            if state.kind == VERSIONED and state.state == "pending":
                _run(conn, _file(source, state.name))
                applied.append(state.name)
        definitions = [f for f in report.files if f.kind == DEFINITION]
        if any(f.state in TO_APPLY for f in definitions):
            # All of them, in order: a definition may depend on another one
            # (a trigger on a function), and each file is idempotent.
            for schema_file in source.definitions:
                _run(conn, schema_file)
            for gone in (f for f in definitions if f.state == "removed"):
                conn.execute(q("schema_forget"), {"name": gone.name})
            applied += [f.name for f in definitions if f.state in ("stale", "new")]
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(q("schema_has_roles"))
            if cur.fetchone()["present"]:  # (a test's own source may lack it)
                cur.execute(q("schema_roles_apply"), {"prefix": role_prefix})
    return applied


def _file(source: Source, name: str) -> SchemaFile:
    return next(f for f in source.all() if f.name == name)


def _run(conn: psycopg.Connection, schema_file: SchemaFile) -> None:
    try:
        # A whole file is one simple-protocol query (no parameters), so it may
        # hold many statements and literal % signs.
        conn.execute(sql.SQL(schema_file.text))  # type: ignore[arg-type]
    except psycopg.Error as exc:
        exc.add_note(f"while applying {schema_file.name}")
        raise
    conn.execute(q("schema_record"), {"name": schema_file.name, "kind": schema_file.kind,
                                      "checksum": schema_file.checksum})


# ---------------------------------------------------------------------------
# the check every process makes when it starts


def check(conn: psycopg.Connection, source: Source | None = None) -> SchemaStatus:
    """Raise SchemaDrift or SchemaPending unless the database is exactly this code's schema."""
    report = status(conn, source)
    if report.drift:
        raise SchemaDrift(report.drift)
    if report.to_apply or report.adopted:
        raise SchemaPending(report.to_apply or [f for f in report.files if f.name in report.adopted])
    return report


def describe(report: SchemaStatus) -> Iterable[str]:
    """`qforge migrate --status`: one line per file."""
    width = max((len(f.name) for f in report.files), default=10)
    for f in report.files:
        when = f" {f.applied_at:%Y-%m-%d %H:%M:%S}" if f.applied_at else ""
        note = f" ({f.detail})" if f.detail else ""
        yield f"{f.state:<8} {f.name:<{width}}{when}{note}"
