"""What routes share: the database pools, the event hub, and the connection dependencies.

`Conn` is a connection to the primary, for writes (and reads that need the
primary). `ReadConn` is a connection to the hot standby of
QFORGE_READ_DATABASE_URL when there is one and it has replayed every write the
client may have seen (app/api/consistency.py), else to the primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Annotated, Callable, Iterator

import psycopg
from fastapi import Depends, Request
from psycopg_pool import ConnectionPool, PoolTimeout

from qforge import replication
from qforge.api.consistency import record_write, required_lsn
from qforge.api.hub import EventHub
from qforge.db import CONNECT_TIMEOUT_SECONDS, KEEPALIVES, behind_pooler, make_pool, resolve_database_url
from qforge.settings import Settings

log = logging.getLogger("qforge.api")

STANDBY_RETRY_SECONDS = 1.0  # after the standby failed us, read from the primary this long before trying again
STANDBY_CHECKOUT_SECONDS = 0.5  # a standby that cannot hand out a connection this fast counts as down


class Resources:
    """Opened on first use (not at startup), so the API starts, and /healthz answers
    503, while the database is down; closed by the app's lifespan."""

    def __init__(self, settings: Settings, database_url: str | None = None, *, readonly_url: str | None = None):
        self.settings = settings
        self._explicit_url = database_url
        self._url: str | None = None
        # the read-only role's URL on the primary (issue 30): reads and the stream use it
        self.readonly_url = readonly_url
        self._pool: ConnectionPool | None = None
        self._readonly_pool: ConnectionPool | None = None
        self._read_pool: ConnectionPool | None = None
        self._hub: EventHub | None = None
        # auth.stream_still_allowed's last question per token name: (asked at, its answer)
        self.stream_verdicts: dict[str, tuple[float, asyncio.Task[bool]]] = {}
        self.open_streams: dict[str, int] = {}  # token name -> its open SSE streams (events.StreamLease)
        self._lock = threading.Lock()
        self._standby_down_until = 0.0
        self.last_write_lsn = 0  # the newest write this process made, as a WAL position
        self.closed = False
        self._timeout_said = False  # the pooler's warning about the statement timeout, said once

    @property
    def database_url(self) -> str:
        with self._lock:
            if self._url is None:
                self._url = resolve_database_url(self._explicit_url, self.settings)
            return self._url

    @property
    def read_database_url(self) -> str | None:
        return self.settings.read_database_url

    def _open_pool(self, url: str, name: str) -> ConnectionPool:
        if self.closed:
            raise psycopg.OperationalError("the API is shutting down")
        # One direct attempt first: a database that is down fails this request
        # at once (503) instead of after the pool's whole timeout.
        psycopg.connect(url, connect_timeout=3).close()
        # autocommit: every command opens its own transaction (conn.transaction()).
        # Checked at checkout: after a failover every idle connection points at
        # the dead primary, and a request should not be the one to find out.
        return make_pool(url, min_size=1, max_size=16, name=name, timeout=5.0, check_on_checkout=True,
                         configure=self._bound_setup(), autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                         **KEEPALIVES)

    def _bound_setup(self) -> Callable[[psycopg.Connection], None] | None:
        """The pool's `configure`: _bound, except behind a transaction pooler, where a session
        setting would stay on a server connection the pooler hands to other clients; there the
        timeout belongs on the roles (docs/operations/pgbouncer.md), and we say so once."""
        if not behind_pooler(self.settings):
            return self._bound
        if self.settings.api_statement_timeout_seconds and not self._timeout_said:
            self._timeout_said = True
            log.warning("QFORGE_POOLER=transaction: QFORGE_API_STATEMENT_TIMEOUT_SECONDS is not set per connection;"
                        " set statement_timeout on the API's roles instead (ALTER ROLE ... SET statement_timeout)")
        return None

    def _bound(self, conn: psycopg.Connection) -> None:
        """Every API connection's statements end after QFORGE_API_STATEMENT_TIMEOUT_SECONDS: no
        request (a wide search, a huge proof) can hold a connection and the server's CPU longer."""
        set_statement_timeout(conn, self.settings.api_statement_timeout_seconds)

    def _pool_once(self, attribute: str, url: str, name: str) -> ConnectionPool:
        """The pool kept in `attribute`, opened on first use (under the lock: one pool per URL)."""
        with self._lock:
            if getattr(self, attribute) is None:
                setattr(self, attribute, self._open_pool(url, name))
            pool: ConnectionPool = getattr(self, attribute)
            return pool

    @property
    def pool(self) -> ConnectionPool:
        return self._pool_once("_pool", self.database_url, "qforge-api")

    @property
    def readonly_pool(self) -> ConnectionPool:
        """The read-only role's pool on the primary, or the API's own without a read-only URL."""
        if not self.readonly_url:
            return self.pool
        return self._pool_once("_readonly_pool", self.readonly_url, "qforge-api-readonly")

    @property
    def read_pool(self) -> ConnectionPool | None:
        """The standby's pool, or None without QFORGE_READ_DATABASE_URL."""
        url = self.read_database_url
        if not url:
            return None
        return self._pool_once("_read_pool", url, "qforge-api-read")

    @property
    def hub(self) -> EventHub:
        if self._hub is None:
            self._hub = EventHub(self.readonly_url or self.database_url, poll_seconds=self.settings.poll_interval_seconds,
                                 read_url=self.read_database_url,
                                 read_wait_seconds=self.settings.read_wait_seconds)
        return self._hub

    def note_write(self, lsn: int) -> None:
        with self._lock:
            self.last_write_lsn = max(self.last_write_lsn, lsn)

    @contextlib.contextmanager
    def read_connection(self, lsn: int = 0) -> Iterator[psycopg.Connection]:
        """A connection that shows every write up to WAL position `lsn` and every write of this
        process: the standby's once it has replayed that far (waiting up to
        QFORGE_READ_WAIT_SECONDS), else the primary's. Without a standby, the primary's."""
        standby = self._standby_connection(max(lsn, self.last_write_lsn))
        if standby is not None:
            pool, conn = standby
            try:
                yield conn
            finally:
                pool.putconn(conn)
            return
        with self.readonly_pool.connection() as conn:
            yield conn

    def _standby_connection(self, lsn: int) -> tuple[ConnectionPool, psycopg.Connection] | None:
        """A standby connection that has replayed `lsn`, or None (no standby, down, or too far behind)."""
        if not self.read_database_url or time.monotonic() < self._standby_down_until:
            return None
        pool: ConnectionPool | None = None
        conn: psycopg.Connection | None = None
        try:
            pool = self.read_pool
            assert pool is not None
            conn = pool.getconn(timeout=STANDBY_CHECKOUT_SECONDS)
            if not lsn or replication.wait_replayed(conn, lsn, self.settings.read_wait_seconds):
                return pool, conn
        except (psycopg.OperationalError, PoolTimeout) as exc:
            if time.monotonic() >= self._standby_down_until:
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                log.warning("reads go to the primary for %.0fs: the standby failed (%s)",
                            STANDBY_RETRY_SECONDS, reason)
            self._standby_down_until = time.monotonic() + STANDBY_RETRY_SECONDS
        if pool is not None and conn is not None:
            pool.putconn(conn)  # too far behind: this read goes to the primary
        return None

    async def aclose(self) -> None:
        self.closed = True
        if self._hub is not None:
            await self._hub.stop()
        self.close_pool()

    def close_pool(self) -> None:
        self.closed = True
        with self._lock:
            pools = (self._pool, self._read_pool, self._readonly_pool)
            self._pool = self._read_pool = self._readonly_pool = None
        for pool in pools:
            if pool is not None:
                pool.close()


def set_statement_timeout(conn: psycopg.Connection, seconds: float) -> None:
    conn.execute("SELECT set_config('statement_timeout', %s, false)", [f"{int(seconds * 1000)}ms"])


def page_bytes(request: Request) -> int:
    """QFORGE_API_PAGE_BYTES: about how much JSON one page of a list, /events or a proof holds."""
    return request.app.state.resources.settings.api_page_bytes


PageBytes = Annotated[int, Depends(page_bytes)]


def resources(request: Request) -> Resources:
    return request.app.state.resources


def connection(request: Request) -> Iterator[psycopg.Connection]:
    """A pooled autocommit connection to the primary for the length of one request (sync
    routes run in the threadpool, so the blocking driver never stalls the event loop).

    With a standby for reads, a write request also records where its commit is in the WAL,
    for the client (X-QForge-LSN, by app/api/consistency.py) and for this process's later reads.
    """
    res = resources(request)
    with res.pool.connection() as conn:
        yield conn
        if res.read_database_url and request.method not in ("GET", "HEAD", "OPTIONS") and not conn.broken:
            lsn = replication.write_lsn(conn)
            res.note_write(lsn)
            record_write(request, lsn)


def read_connection(request: Request) -> Iterator[psycopg.Connection]:
    """A connection for a read: the standby's when it shows what the client may have written."""
    with resources(request).read_connection(required_lsn(request)) as conn:
        yield conn


# scope="function": the connection goes back to the pool (and a write's LSN is recorded)
# when the route returns, before the response is sent.
Conn = Annotated[psycopg.Connection, Depends(connection, scope="function")]
ReadConn = Annotated[psycopg.Connection, Depends(read_connection, scope="function")]
