"""One reader of the log per API process, shared by every SSE subscriber.

The hub LISTENs for appends, reads each new page of the log ONCE through the
gapless cursor, encodes each event as an SSE message ONCE, and keeps the most
recent ones in memory; subscribers then take what lies after their own cursor
from that cache instead of each querying and encoding the log. (100
subscribers at 1,000 events/s used to mean 100 queries and 100,000 JSON
encodings a second; now it is one query per wake-up and 1,000 encodings.)

The cache is a contiguous run of the log in (xid, position) order, starting
just after `cached_from`; a subscriber whose cursor is behind that (resuming an
old cursor, or too slow to keep up) reads the log itself until it catches up,
so nothing is ever skipped and a slow client costs only itself.

NOTIFY only says "something was appended"; it is not proof that a reader can
see it yet (a gapless reader sees an event only once every older transaction
has ended, and the transaction that ends last may append nothing). So the hub
also re-reads every `poll_seconds`.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import json
import logging
import time
from typing import Callable, NamedTuple

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from sse_starlette import ServerSentEvent

from qforge import replication
from qforge.db import CONNECT_TIMEOUT_SECONDS, KEEPALIVES, Backoff, direct_url, pooler_kwargs, say_polling
from qforge.events import store
from qforge.events.types import Event
from qforge.sql import q

log = logging.getLogger("qforge.api.hub")

CACHE_EVENTS = 20_000  # recent events kept encoded in memory, shared by all subscribers
READ_PAGE = 1_000
COALESCE_SECONDS = 0.02  # a burst of notifications becomes one read
SHARED_BATCHES = 64  # distinct cursors whose batch is kept between two reads (memory bound)


class Key(NamedTuple):
    """What subscribers' filters look at, in str and tuples only."""
    stream_id: str
    workflow_id: str | None
    type: str
    actor: str
    tags: tuple[tuple[str, str], ...]


class Message(NamedTuple):
    """One cached event: its cursor, its SSE bytes, and its filter key. No pydantic Event:
    with one, each cached event was 8 objects the garbage collector tracks, and filling the
    cache (the first repetition of the bench) set off full collections of 0.1-0.3 s that
    stopped every stream; a Message and its Key are 2 (the rest is str, bytes and tuples
    of them, which the collector stops tracking), and none happens while it fills."""
    cursor: store.Cursor
    sse: bytes
    key: Key


def key_of(event: Event) -> Key:
    return Key(str(event.stream_id), None if event.workflow_id is None else str(event.workflow_id),
               event.type, event.actor, tuple(event.tags.items()))


class Batch(NamedTuple):
    """What a subscriber sends next: `count` events up to `cursor`, as one chunk."""
    cursor: store.Cursor  # the last event taken (the subscriber's next cursor)
    count: int  # events taken, matching or not (a full page means: read again at once)
    sse: bytes  # the matching ones' SSE messages, joined


def encode(event: Event, key: Key | None = None) -> Message:
    cursor = store.cursor_of(event)
    sse = ServerSentEvent(id=store.encode_cursor(cursor), event=event.type,
                          data=json.dumps(event.model_dump(mode="json"))).encode()
    return Message(cursor, sse, key_of(event) if key is None else key)


class EventHub:
    def __init__(self, database_url: str, *, poll_seconds: float = 1.0, read_url: str | None = None,
                 read_wait_seconds: float = 1.0):
        self.database_url = database_url
        self.poll_seconds = poll_seconds
        # A hot standby cannot LISTEN: the hub listens on the primary and, with a
        # standby, reads there once it has replayed what the primary had written.
        self.read_url = read_url
        self.read_wait_seconds = read_wait_seconds
        self._read_conn: psycopg.AsyncConnection | None = None
        self._standby_down_until = 0.0
        self.cache: collections.deque[Message] = collections.deque()
        self.cached_from: store.Cursor | None = None  # the cursor just before cache[0]
        self.read_cursor: store.Cursor | None = None  # the last event the hub has read
        # batch_after's results for unfiltered subscribers, by (cursor, limit), until the
        # cache changes: the subscribers at the same cursor (all of them, once caught up)
        # share one chunk instead of each filtering and joining the same messages.
        self._batches: dict[tuple[store.Cursor, int], Batch] = {}
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
        read_conn, self._read_conn = self._read_conn, None
        if read_conn is not None:
            with contextlib.suppress(Exception):
                await read_conn.close()
        self._wake()  # let waiting subscribers notice and finish

    def changed(self) -> asyncio.Event:
        """An event set when new events are cached. Take it BEFORE reading, wait on it
        after: new events during the read then leave it already set, so none is missed."""
        self.start()
        return self._changed

    def after(self, cursor: store.Cursor, limit: int) -> list[Message] | None:
        """Up to `limit` cached messages after `cursor`, or None if the cache does not
        reach back that far (the caller must read the log itself)."""
        if self.cached_from is None or cursor < self.cached_from:
            return None
        start = bisect.bisect_right(self.cache, cursor, key=lambda m: m.cursor)
        stop = min(len(self.cache), start + limit)
        return [self.cache[i] for i in range(start, stop)]

    def batch_after(self, cursor: store.Cursor, limit: int,
                    match: Callable[[Key], bool] | None = None) -> Batch | None:
        """The next batch after `cursor` from the cache (up to `limit` events; of them, the
        SSE messages of those `match` keeps, all without it), or None if the cache does
        not reach back that far."""
        key = (cursor, limit)
        if match is None and key in self._batches:
            return self._batches[key]
        messages = self.after(cursor, limit)
        if messages is None:
            return None
        batch = Batch(messages[-1].cursor if messages else cursor, len(messages),
                      b"".join(m.sse for m in messages if match is None or match(m.key)))
        if match is None and len(self._batches) < SHARED_BATCHES:
            self._batches[key] = batch
        return batch

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _run(self) -> None:
        backoff = Backoff()  # the workers' capped backoff: back within 2 s of the database
        # Behind a transaction pooler LISTEN needs a direct connection (QFORGE_LISTEN_DATABASE_URL);
        # without one the hub reads through the pooler every poll_seconds.
        listen_url = direct_url(self.database_url)
        if listen_url is None:
            say_polling("the API's event hub", self.poll_seconds)
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                        listen_url or self.database_url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                        **KEEPALIVES, **pooler_kwargs()) as conn:
                    if listen_url is not None:
                        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(store.EVENTS_CHANNEL)))
                    if backoff.failures:
                        log.warning("event hub reconnected")
                    backoff.reset()
                    while listen_url is None:
                        await self._read(conn)
                        await asyncio.sleep(self.poll_seconds)
                    while True:
                        await self._read(conn)
                        # Leave as soon as one notification arrives, or after the poll interval.
                        notified = False
                        async for _ in conn.notifies(timeout=self.poll_seconds, stop_after=1):
                            notified = True
                        if notified:
                            await asyncio.sleep(COALESCE_SECONDS)
                            async for _ in conn.notifies(timeout=0.001):
                                pass  # the burst's other notifications: one read covers them
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database went away: retry, subscribers read for themselves
                delay = backoff.next_delay()
                if backoff.failures == 1:  # one line per outage, not one per attempt
                    log.warning("event hub lost its connection (%s); reconnecting with backoff",
                                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
                self._wake()
                await asyncio.sleep(delay)

    async def _reader(self, primary: psycopg.AsyncConnection) -> psycopg.AsyncConnection:
        """The standby's connection once it shows everything the primary has now, else the primary's."""
        if not self.read_url or time.monotonic() < self._standby_down_until:
            return primary
        lsn = await replication.write_lsn_async(primary)  # the primary's errors are the caller's
        try:
            if self._read_conn is None or self._read_conn.closed:
                self._read_conn = await psycopg.AsyncConnection.connect(
                    self.read_url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS, **KEEPALIVES,
                    **pooler_kwargs())
            if await replication.wait_replayed_async(self._read_conn, lsn, self.read_wait_seconds):
                return self._read_conn
        except psycopg.OperationalError as exc:
            log.warning("event hub reads from the primary for a while: the standby failed (%s)",
                        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
            self._standby_down_until = time.monotonic() + 1.0
            if self._read_conn is not None:
                await self._read_conn.close()
                self._read_conn = None
        return primary

    async def _read(self, primary: psycopg.AsyncConnection) -> None:
        conn = await self._reader(primary)
        async with conn.cursor(row_factory=dict_row) as cur:
            if self.read_cursor is None:
                await cur.execute(q("events_tail_cursor"), {"back": 0})
                row = await cur.fetchone()
                self.read_cursor = store.START if row is None else (int(row["xid"]), int(row["position"]))
                self.cached_from = self.read_cursor
            grew = False
            while True:
                await cur.execute(q("events_after"), {
                    "after_xid": str(self.read_cursor[0]), "after_position": self.read_cursor[1],
                    "limit": READ_PAGE})
                rows = await cur.fetchall()
                for row in rows:
                    message = encode(Event.from_row(row))
                    self.cache.append(message)
                    self.read_cursor = message.cursor
                grew = grew or bool(rows)
                while len(self.cache) > CACHE_EVENTS:
                    self.cached_from = self.cache.popleft().cursor
                if rows:
                    self._batches.clear()  # they end where the cache ended
                if len(rows) < READ_PAGE:
                    break
        if grew:
            self._wake()
