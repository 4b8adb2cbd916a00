"""What the subcommands share: finding the database, and waiting for a schema that matches this code."""

from __future__ import annotations

import logging
import sys
import time

import psycopg

from qforge.db import EmbeddedPostgresError, connect, resolve_database_url
from qforge.migrate import SchemaDrift, SchemaPending, check
from qforge.settings import Settings

log = logging.getLogger("qforge")

SCHEMA_RECHECK_SECONDS = 2.0


def complain(command: str, message: object) -> None:
    """One line (or a few) on stderr, prefixed with the command."""
    print(f"qforge {command}: {message}", file=sys.stderr, flush=True)


def database_url(command: str, explicit: str | None) -> str | None:
    """The URL to use (starting the embedded server if need be), or None after saying why not."""
    try:
        return resolve_database_url(explicit)
    except EmbeddedPostgresError as exc:
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
