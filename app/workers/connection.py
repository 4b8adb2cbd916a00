"""A database connection that outlives PostgreSQL restarts, for the long-running worker and monitor."""

from __future__ import annotations

import logging
from typing import Any, Callable, TypeVar

import psycopg

from qforge.db import CONNECT_TIMEOUT_SECONDS, KEEPALIVES, Backoff, pooler_kwargs, use_fast_json  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

T = TypeVar("T")

# What a restart, a failover or a broken network looks like to a client.
# psycopg files deadlocks and serialization failures (SQLSTATE 40xxx) under
# OperationalError too: those are transient as well, and retrying them is what
# we want, but they do not cost the connection.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (psycopg.OperationalError, psycopg.InterfaceError)


def connect(url: str, application_name: str, **kwargs: Any) -> psycopg.Connection:
    """An autocommit connection (so each command's transaction() is a real transaction)."""
    conn = psycopg.connect(url, autocommit=True, application_name=application_name[:63],
                           connect_timeout=CONNECT_TIMEOUT_SECONDS, **KEEPALIVES, **pooler_kwargs(), **kwargs)
    use_fast_json(conn)
    return conn


async def connect_async(url: str, application_name: str) -> psycopg.AsyncConnection:
    conn = await psycopg.AsyncConnection.connect(
        url, autocommit=True, application_name=application_name[:63],
        connect_timeout=CONNECT_TIMEOUT_SECONDS, **KEEPALIVES, **pooler_kwargs())
    use_fast_json(conn)
    return conn


class Reconnecting:
    """One sync connection, opened on first use and again after it breaks.

    `run(fn)` calls `fn(conn, ...)`; a transient error propagates (the caller
    decides when to retry), and if it broke the connection the next `run`
    opens a new one (and calls `setup(conn)` on it first). Not thread-safe: one
    caller (thread) at a time.
    """

    def __init__(self, url: str, application_name: str,
                 setup: Callable[[psycopg.Connection], None] | None = None) -> None:
        self.url = url
        self.application_name = application_name
        self.setup = setup
        self.conn: psycopg.Connection | None = None

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self.conn is None or self.conn.closed:
            conn = connect(self.url, self.application_name)
            try:
                if self.setup is not None:
                    self.setup(conn)
            except BaseException:
                conn.close()
                raise
            self.conn = conn
            log.debug("connected to the database")
        conn = self.conn
        try:
            return fn(conn, *args, **kwargs)
        except TRANSIENT_ERRORS:
            if conn.closed or conn.broken:
                self.close()
            raise

    def close(self) -> None:
        conn, self.conn = self.conn, None
        close_quietly(conn)


def close_quietly(conn: psycopg.Connection | None) -> None:
    """Close `conn` if any, logging (at debug) rather than raising what closing a broken one raises."""
    if conn is not None:
        try:
            conn.close()
        except Exception:  # closing a broken connection must not mask why it broke
            log.debug("error closing a connection", exc_info=True)


def describe(exc: BaseException) -> str:
    """One line for the log: the error class and its first line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
