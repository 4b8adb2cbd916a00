"""Connections and pools: opening them, the pools' reconnect policy, and URLs.

Every connection QForge opens goes through here, so the settings that shape a
connection (the JSON loader, keepalives, the pools' reconnect policy, and
behind a transaction pooler no server-side prepared statements) are decided
in one place.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from typing import Any, Callable
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool

from qforge.settings import Settings, get_settings

_log = logging.getLogger("qforge.db")


def json_loads(data: bytes) -> Any:
    """json.loads for the json and jsonb values PostgreSQL sends (UTF-8 text), faster on the
    common cases: an empty object is not parsed, and text is decoded first (json.loads of
    bytes first guesses the encoding: about 0.5 µs more per value). A worker reads three such
    values per claimed job (payload, tags, trace); the standard loader took a tenth of its CPU
    in a no-op drain (py-spy). The values are exactly json.loads's (big integers stay exact)."""
    if data == b"{}":
        return {}
    return json.loads(data.decode())


def use_fast_json(conn: psycopg.Connection | psycopg.AsyncConnection) -> None:
    """Read json and jsonb on `conn` with json_loads."""
    set_json_loads(json_loads, conn)


def connect(url: str, **kwargs: Any) -> psycopg.Connection:
    """Open a connection (``autocommit=False`` unless given; pass ``row_factory=dict_row`` for dicts)."""
    kwargs.setdefault("autocommit", False)
    return psycopg.connect(url, **pooler_kwargs(), **kwargs)


# --------------------------------------------------------------------------
# Behind a transaction pooler (QFORGE_POOLER=transaction, docs/operations/pgbouncer.md)
#
# PgBouncer in transaction mode hands a client's next transaction to whichever
# server connection is free. So nothing may outlive a transaction on a pooled
# connection: no prepared statement (psycopg prepares a statement after its
# fifth run, and PgBouncer 1.18 does not carry prepared statements across
# server connections: `prepared statement "_pg3_0" does not exist`), no SET or
# set_config(..., false), no session advisory lock, no LISTEN. What needs a
# session (LISTEN, the session locks of the monitor's leadership, migrate,
# archive, pack, replay) goes to QFORGE_LISTEN_DATABASE_URL, a direct
# connection; without it LISTEN gives way to polling. Without QFORGE_POOLER
# none of this applies and nothing changes.

_polling_said: set[str] = set()


def behind_pooler(settings: Settings | None = None) -> bool:
    """True with QFORGE_POOLER=transaction."""
    return (settings or get_settings()).pooler == "transaction"


def pooler_kwargs(settings: Settings | None = None) -> dict[str, Any]:
    """psycopg options every pooled connection needs: none without a pooler; behind a
    transaction pooler no prepared statements (prepare_threshold=None)."""
    return {"prepare_threshold": None} if behind_pooler(settings) else {}


def direct_url(url: str, settings: Settings | None = None) -> str | None:
    """The URL for what needs a session of its own (LISTEN, a session advisory lock): `url`
    itself without a pooler; behind a transaction pooler QFORGE_LISTEN_DATABASE_URL (logged in
    as `url` is, unless it names a user of its own); None when that is not set."""
    settings = settings or get_settings()
    if not behind_pooler(settings):
        return url
    listen = settings.listen_database_url
    if not listen:
        return None
    if url_login(listen)[0] is None:
        user, password = url_login(url)
        if user is not None:
            return with_credentials(listen, user, password)
    return listen


def say_polling(what: str, seconds: float) -> None:
    """One log line per process and `what`: behind the pooler without a direct URL, `what`
    polls every `seconds` instead of waiting for NOTIFY."""
    if what not in _polling_said:
        _polling_said.add(what)
        _log.warning("QFORGE_POOLER=transaction without QFORGE_LISTEN_DATABASE_URL: %s polls every %gs"
                     " instead of LISTEN (set QFORGE_LISTEN_DATABASE_URL to a direct connection to wake at once)",
                     what, seconds)


CONNECT_TIMEOUT_SECONDS = 5
# Only used on TCP: notice a peer that vanished without a reset in about 25 s
# (idle) or 30 s (waiting for an answer) instead of the kernel's hours.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
              "tcp_user_timeout": 30_000}


class Backoff:
    """Capped exponential delays with jitter: 0.1, 0.2, 0.4 ... cap seconds (each 50-100 %).

    The cap is low on purpose: a failed connection attempt costs next to
    nothing, and every second a worker waits after the database is back (or a
    standby has been promoted), its running jobs go without heartbeats and
    the API answers 503.
    """

    def __init__(self, base: float = 0.1, cap: float = 2.0) -> None:
        self.base, self.cap, self.failures = base, cap, 0

    def next_delay(self) -> float:
        delay = min(self.cap, self.base * 2 ** min(self.failures, 30))
        self.failures += 1
        return delay * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.failures = 0


class ReconnectingPool(ConnectionPool):
    """A pool that gets its connections back after a restart or a failover, fast.

    psycopg_pool retries a failed connection attempt itself, but its delay
    doubles without a cap (1, 2, 4 ... s up to ``reconnect_timeout``): after a
    minute-long outage the API would stay down for another minute. Here the
    connect step retries with the workers' capped ``Backoff`` (at most 2 s
    apart) until it succeeds or the pool closes. It logs one line when the
    database goes (a connection found broken, or a connection attempt that
    fails) and one when a new connection succeeds again, not one per attempt.
    """

    def __init__(self, *args: Any, check_on_checkout: bool = False, **kwargs: Any) -> None:
        if check_on_checkout:
            kwargs["check"] = self._check
        self._outage_lock = threading.Lock()
        self._down_since: float | None = None
        super().__init__(*args, **kwargs)

    def _mark_down(self, exc: BaseException | str) -> None:
        with self._outage_lock:
            if self._down_since is None:
                self._down_since = time.monotonic()
                reason = exc if isinstance(exc, str) else _first_line(exc)
                _log.warning("database unavailable for pool %s (%s); reconnecting with backoff", self.name, reason)

    def _check(self, conn: Any) -> None:
        try:
            ConnectionPool.check_connection(conn)
        except Exception as exc:
            self._mark_down(exc)
            raise

    def putconn(self, conn: Any) -> None:
        if conn.broken:
            self._mark_down("a connection broke")
        super().putconn(conn)

    def _connect(self, timeout: float | None = None) -> Any:
        backoff = Backoff()
        while True:
            try:
                conn = super()._connect(timeout)
            except psycopg.OperationalError as exc:
                if self.closed:
                    raise
                self._mark_down(exc)
                time.sleep(backoff.next_delay())
                continue
            with self._outage_lock:
                if self._down_since is not None:
                    _log.warning("database back for pool %s after %.1fs", self.name,
                                 time.monotonic() - self._down_since)
                    self._down_since = None
            return conn


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def make_pool(
    url: str,
    min_size: int = 1,
    max_size: int = 10,
    *,
    name: str | None = None,
    timeout: float = 30.0,
    check_on_checkout: bool = False,
    configure: Callable[[Any], None] | None = None,
    **connection_kwargs: Any,
) -> ConnectionPool:
    """An open pool whose first ``min_size`` connections are ready; close it when done.

    ``check_on_checkout`` costs one round trip per checkout and hands out no
    connection that died while idle (e.g. to a primary that was replaced).
    """
    connection_kwargs = {**pooler_kwargs(), **connection_kwargs}
    pool = ReconnectingPool(
        url,
        min_size=min_size,
        max_size=max_size,
        kwargs=connection_kwargs or None,
        name=name,
        timeout=timeout,
        check_on_checkout=check_on_checkout,
        configure=configure,
        open=True,
    )
    try:
        pool.wait(timeout=timeout)
    except BaseException:
        pool.close()
        raise
    return pool


def with_database(url: str, dbname: str) -> str:
    """The same server address with another database name (URL or key=value form)."""
    if url.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(url)
        return urlunsplit(parts._replace(path="/" + quote(dbname, safe="")))
    params = conninfo_to_dict(url)
    params["dbname"] = dbname
    return make_conninfo(**params)



def with_credentials(url: str, user: str, password: str | None) -> str:
    """The same server and database, logged in as `user` with `password` (URL or key=value form)."""
    if url.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
        login = quote(user, safe="") + (":" + quote(password, safe="") if password is not None else "")
        return urlunsplit(parts._replace(netloc=f"{login}@{host}"))
    params = conninfo_to_dict(url)
    params["user"] = user
    if password is None:
        params.pop("password", None)
    else:
        params["password"] = password
    return make_conninfo(**params)


def url_login(url: str) -> tuple[str | None, str | None]:
    """(user, password) a URL logs in with."""
    params = conninfo_to_dict(url)
    return params.get("user"), params.get("password")
