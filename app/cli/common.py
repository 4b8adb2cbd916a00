"""What the subcommands share: finding the database, and waiting for a schema that matches this code."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Callable, TypeVar

import psycopg

from qforge.cli.progress import Progress
from qforge.db import EmbeddedPostgresError, connect, direct_url, resolve_database_url
from qforge.migrate import SchemaDrift, SchemaPending, check
from qforge.settings import Settings

log = logging.getLogger("qforge")

SCHEMA_RECHECK_SECONDS = 2.0

T = TypeVar("T")


def complain(command: str, message: object) -> None:
    """One line (or a few) on stderr, prefixed with the command."""
    print(f"qforge {command}: {message}", file=sys.stderr, flush=True)


def database_url(command: str, explicit: str | None, role: str | None = None, *,
                 session: bool = False) -> str | None:
    """The URL to use (starting the embedded server if need be), or None after saying why not.
    `role`: the process's own role (api, worker, monitor: docs/security.md); None: the schema
    owner's. `session`: the command holds a session advisory lock across transactions
    (migrate, archive, pack, replay), so behind a transaction pooler it needs the direct
    connection (QFORGE_LISTEN_DATABASE_URL)."""
    try:
        url = resolve_database_url(explicit, role=role)
    except EmbeddedPostgresError as exc:
        complain(command, exc)
        return None
    return session_url(command, url) if session else url


def session_url(command: str, url: str) -> str | None:
    """`url`, or behind a transaction pooler the direct one; None after saying it is missing."""
    direct = direct_url(url)
    if direct is None:
        complain(command, "QFORGE_POOLER=transaction: this command holds a session lock, which a transaction"
                          " pooler cannot keep; set QFORGE_LISTEN_DATABASE_URL to a direct connection")
    return direct


def batch_job_url(command: str, args, shares: dict[str, float | None]) -> str | None:
    """The database URL for a batch job beside a live queue (archive, pack), its schema
    ready, and this process niced by --nice; None after saying what is wrong (a share of
    the time in `shares` outside (0, 1], a negative --nice)."""
    for option, share in shares.items():
        if share is not None and not 0 < share <= 1:
            complain(command, f"{option} is a share of the time, 0 < SHARE <= 1, not {share}")
            return None
    if args.nice < 0:
        complain(command, f"--nice lowers the priority: N >= 0, not {args.nice}")
        return None
    url = database_url(command, getattr(args, "database_url", None), session=True)
    if url is None or not wait_for_schema(command, url):
        return None
    os.nice(args.nice)  # a batch job: the queue's own processes on this machine go first
    return url


def run_batch_job(command: str, args, errors: tuple[type[Exception], ...],
                  work: Callable[[psycopg.Connection, Progress], T]) -> T | None:
    """`work(conn, progress)` as a batch job beside a live queue (archive, pack: --duty,
    --busy-duty and --nice checked, see batch_job_url) with a progress line in positions;
    None after saying what went wrong (one of `errors`)."""
    url = batch_job_url(command, args, {"--duty": args.duty, "--busy-duty": args.busy_duty})
    if url is None:
        return None
    try:
        with connect(url, autocommit=True) as conn, Progress(command, unit="positions") as progress:
            return work(conn, progress)
    except errors as exc:
        complain(command, exc)
        return None


def configure_logging(settings: Settings) -> None:
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def wait_for_schema(command: str, url: str) -> bool:
    """Block until the database's schema is this code's (a migration may still be running
    elsewhere, e.g. a deployment's migration job); False, after saying why, on drift."""
    waiting_said = False
    down_said = False
    while True:
        try:
            with connect(url, autocommit=True, connect_timeout=5) as conn:
                check(conn)
            return True
        except SchemaDrift as exc:
            complain(command, exc)
            return False
        except SchemaPending as exc:
            if not waiting_said:
                log.warning("%s; waiting for it", exc)
                waiting_said = True
        except psycopg.OperationalError as exc:
            if not down_said:
                log.warning("waiting for the database (%s)", str(exc).strip().splitlines()[0])
                down_said = True
        time.sleep(SCHEMA_RECHECK_SECONDS)
