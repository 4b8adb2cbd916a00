"""Which monitor leads: exactly one at a time, however many run, with or without a pooler.

The lock is one advisory lock (MONITOR_LOCK_KEY); where it lives depends on the connection:

- Direct (no QFORGE_POOLER): a session lock on the monitor's own working connection, as it
  has always been: when the leader dies its connection closes and the lock frees; when the
  connection breaks the leader stops acting at once (it had been acting on that connection).
- Behind a transaction pooler with QFORGE_LISTEN_DATABASE_URL: the same session lock, on a
  direct connection of its own; the monitor's work goes through the pooler.
- Behind a transaction pooler without it: a transaction-level lock (pg_try_advisory_xact_lock)
  taken in a transaction the leader keeps open through the pooler. PgBouncer gives an open
  transaction one server connection until it ends, so the lock sits on one server session for
  as long as the leader lives, exactly like the session lock: when the leader's process dies,
  PgBouncer closes that server connection (a connection in the middle of a transaction cannot be
  handed to anyone else) and PostgreSQL rolls back, freeing the lock. Two monitors cannot both
  hold it (it is one lock on one server). The transaction writes nothing and keeps no snapshot
  between statements (read committed), so it holds back no vacuum; it costs one of the pool's
  server connections while it leads. A server's idle_in_transaction_session_timeout would end
  it: the leader finds out at its next tick (holds() is False) and stops acting before anyone
  else can lead, then competes again. A lease row with an expiry would need a clock and a
  grace period; the lock needs neither.
"""

from __future__ import annotations

import logging

import psycopg
from psycopg.rows import tuple_row

from qforge.db import behind_pooler, direct_url
from qforge.settings import Settings
from qforge.sql import q
from qforge.workers.connection import TRANSIENT_ERRORS, close_quietly, connect, describe

log = logging.getLogger("qforge.monitor")

# Fixed key of the leadership lock ("QForge" in ASCII plus 2; migrations use +1).
MONITOR_LOCK_KEY = 0x5146_6F72_6765_0002


class Leadership:
    """take(work_conn) -> leads now?; holds() -> still leads? (call before each round of duties);
    release() when stopping or after the working connection broke."""

    def __init__(self, url: str, name: str, settings: Settings) -> None:
        self.name = f"qforge-monitor {name} leadership"
        self.own_url: str | None = None  # None: the lock lives on the working connection
        self.in_transaction = False
        if behind_pooler(settings):
            self.own_url = direct_url(url, settings)
            if self.own_url is None:
                self.own_url, self.in_transaction = url, True
        self.conn: psycopg.Connection | None = None

    def take(self, work_conn: psycopg.Connection) -> bool:
        if self.own_url is None:
            return _try(work_conn, "monitor_try_lead")
        try:
            if self.conn is None or self.conn.closed:
                self.conn = connect(self.own_url, self.name)
            if not self.in_transaction:
                return _try(self.conn, "monitor_try_lead")
            self.conn.execute("BEGIN")
            if _try(self.conn, "monitor_try_lead_xact"):
                return True  # the transaction stays open: it is the leadership
            self.conn.execute("ROLLBACK")
            return False
        except TRANSIENT_ERRORS as exc:
            log.warning("leadership connection failed (%s)", describe(exc))
            self.release()
            return False

    def holds(self) -> bool:
        if self.own_url is None:
            return True  # the working connection's errors end leadership (the monitor's loop)
        try:
            assert self.conn is not None
            self.conn.execute(q("monitor_still_leads"))
            return True
        except (TRANSIENT_ERRORS + (AssertionError,)) as exc:
            log.warning("monitor lost its leadership connection (%s)", describe(exc))
            self.release()
            return False

    def release(self) -> None:
        """Close the lock's own connection (frees the lock now rather than when the server notices)."""
        conn, self.conn = self.conn, None
        close_quietly(conn)


def _try(conn: psycopg.Connection, statement: str) -> bool:
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(q(statement), {"key": MONITOR_LOCK_KEY}).fetchone()
    return bool(row and row[0])
