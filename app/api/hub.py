"""One LISTEN connection per API process that wakes every SSE subscriber when the log grows.

NOTIFY only says "something was appended"; it is not proof that a reader can
see it yet: a gapless reader sees an event only once every older transaction
has ended, and the transaction that ends last may append nothing (so it sends
no NOTIFY). So on every notification, and at least every `poll_seconds`, the
hub asks for the gapless tail cursor; subscribers are woken only when it moved.
That is one cheap query per second per process, whatever the number of
subscribers, and the tail can only move when a reader has something new to read
(newly visible events always sort after every event visible before).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
from psycopg import sql

from app.events import store
from app.sql import q

log = logging.getLogger("qforge.api.hub")


class EventHub:
    def __init__(self, database_url: str, *, poll_seconds: float = 1.0):
        self.database_url = database_url
        self.poll_seconds = poll_seconds
        self.tail: store.Cursor | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Start listening (idempotent; must run on the serving event loop)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="qforge-event-hub")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._wake()  # let waiting subscribers notice and finish

    def changed(self) -> asyncio.Event:
        """An event set at the next tail move. Take it BEFORE reading, wait on it after:
        a move during the read then leaves it already set, so no wake-up is lost."""
        self.start()
        return self._changed

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _run(self) -> None:
        delay = 0.5
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                        self.database_url, autocommit=True) as conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(store.EVENTS_CHANNEL)))
                    delay = 0.5
                    while True:
                        await self._check(conn)
                        # Leave as soon as one notification arrives, or after the poll interval.
                        async for _ in conn.notifies(timeout=self.poll_seconds, stop_after=1):
                            pass
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database went away: retry, subscribers keep polling
                log.warning("event hub lost its connection (%s); retrying in %.1fs", exc, delay)
                self._wake()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _check(self, conn: psycopg.AsyncConnection) -> None:
        cur = await conn.execute(q("events_tail_cursor"))
        row = await cur.fetchone()
        tail = store.START if row is None else (int(row[0]), int(row[1]))
        if tail != self.tail:
            self.tail = tail
            self._wake()
