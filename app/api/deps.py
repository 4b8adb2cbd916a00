"""What routes share: the database pool, the event hub, and the connection dependency."""

from __future__ import annotations

import threading
from typing import Annotated, Iterator

import psycopg
from fastapi import Depends, Request
from psycopg_pool import ConnectionPool

from qforge.api.hub import EventHub
from qforge.db import CONNECT_TIMEOUT_SECONDS, KEEPALIVES, make_pool, resolve_database_url
from qforge.settings import Settings


class Resources:
    """Opened on first use (not at startup), so the API starts, and /healthz answers
    503, while the database is down; closed by the app's lifespan."""

    def __init__(self, settings: Settings, database_url: str | None = None):
        self.settings = settings
        self._explicit_url = database_url
        self._url: str | None = None
        self._pool: ConnectionPool | None = None
        self._hub: EventHub | None = None
        self._lock = threading.Lock()
        self.closed = False

    @property
    def database_url(self) -> str:
        with self._lock:
            if self._url is None:
                self._url = resolve_database_url(self._explicit_url, self.settings)
            return self._url

    @property
    def pool(self) -> ConnectionPool:
        url = self.database_url
        with self._lock:
            if self._pool is None:
                if self.closed:
                    raise psycopg.OperationalError("the API is shutting down")
                # One direct attempt first: a database that is down fails this request
                # at once (503) instead of after the pool's whole timeout.
                psycopg.connect(url, connect_timeout=3).close()
                # autocommit: every command opens its own transaction (conn.transaction()).
                # Checked at checkout: after a failover every idle connection points at
                # the dead primary, and a request should not be the one to find out.
                self._pool = make_pool(url, min_size=1, max_size=16, name="qforge-api",
                                       timeout=5.0, check_on_checkout=True, autocommit=True,
                                       connect_timeout=CONNECT_TIMEOUT_SECONDS, **KEEPALIVES)
            return self._pool

    @property
    def hub(self) -> EventHub:
        if self._hub is None:
            self._hub = EventHub(self.database_url, poll_seconds=self.settings.poll_interval_seconds)
        return self._hub

    async def aclose(self) -> None:
        self.closed = True
        if self._hub is not None:
            await self._hub.stop()
        self.close_pool()

    def close_pool(self) -> None:
        self.closed = True
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


def resources(request: Request) -> Resources:
    return request.app.state.resources


def connection(request: Request) -> Iterator[psycopg.Connection]:
    """A pooled autocommit connection for the length of one request (sync routes run in
    the threadpool, so the blocking driver never stalls the event loop)."""
    with resources(request).pool.connection() as conn:
        yield conn


Conn = Annotated[psycopg.Connection, Depends(connection)]
