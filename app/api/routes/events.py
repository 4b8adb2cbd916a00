"""The global event log: GET /events (pages) and GET /events/stream (Server-Sent Events).

Both read only through the gapless cursor of qforge.events.store.read_after, so a
reader never skips an event whatever order concurrent transactions commit in,
and the SSE `id` of each message is that cursor: a reconnecting EventSource
sends it back as Last-Event-ID and resumes exactly after it.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated, AsyncIterator, Awaitable, Callable
from uuid import UUID

import psycopg
from fastapi import APIRouter, Header, Query, Request
from psycopg_pool import PoolTimeout
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from qforge.api import auth
from qforge.api.auth import Caller, needs
from qforge.api.common import ERRORS, bad_query, tags_of
from qforge.api.deps import PageBytes, ReadConn, Resources
from qforge.api.errors import ApiError
from qforge.api.hub import Batch, Key, encode, key_of
from qforge.api.models import EventPage, StreamTicket
from qforge.events import store
from qforge.events.types import Event

router = APIRouter(tags=["events"])

READ_CHUNK = 20  # events GET /events reads per statement, so that a page stops near its byte bound
PAGE_SIZE = 200  # events a subscriber holds at once: memory per client is bounded by this
IDLE_RECHECK_SECONDS = 5.0  # a subscriber re-reads at least this often even without a wake-up
PING_SECONDS = 15
SEND_TIMEOUT_SECONDS = 60  # a client that takes no data for this long is dropped (it resumes)

cursor_query = Annotated[str | None, Query(
    max_length=60, description='a cursor from an earlier event or page; "0" = the beginning')]


def parse_cursor(text: str | None) -> store.Cursor:
    with bad_query():
        cursor = store.decode_cursor(text)
        if cursor[0] >= 2**64 or cursor[1] >= 2**63:
            raise ValueError(f"cursor {text!r} is out of range")
    return cursor


@router.get("/events", response_model=None, responses={200: {"model": EventPage}, **ERRORS})
def list_events(conn: ReadConn, max_bytes: PageBytes, after: cursor_query = None,
                limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> dict:
    """The log in order, after a cursor (from the beginning without one); `next` resumes. A page
    ends after `limit` events or once it holds about QFORGE_API_PAGE_BYTES of JSON (at least one
    event), whichever comes first."""
    cursor = parse_cursor(after)
    dumped: list[dict] = []
    size = 0
    while len(dumped) < limit:
        # Read a few at a time: one event may be a MiB, so a page of 1,000 read at once could be a GB.
        chunk = store.read_after(conn, cursor, min(limit - len(dumped), READ_CHUNK))
        for event in chunk:
            item = event.model_dump(mode="json")
            weight = len(json.dumps(item))
            if dumped and size + weight > max_bytes:
                return {"events": dumped, "next": store.encode_cursor(cursor)}
            dumped.append(item)
            size += weight
            cursor = store.cursor_of(event)
        if len(chunk) < READ_CHUNK:
            break
    return {"events": dumped, "next": store.encode_cursor(cursor)}


class Filters:
    """Which events a subscriber wants (every given filter must match)."""

    def __init__(self, workflow_id: UUID | None, job_id: UUID | None,
                 tags: list[tuple[str, str]], types: set[str], actor: str | None = None):
        # as str: they are compared with the cached messages' keys (hub.Key)
        self.workflow_id = None if workflow_id is None else str(workflow_id)
        self.job_id = None if job_id is None else str(job_id)
        self.tags, self.types, self.actor = tags, types, actor

    def __bool__(self) -> bool:
        """Is any filter set (else every event matches)?"""
        return bool(self.workflow_id or self.job_id or self.tags or self.types or self.actor)

    def match(self, key: Key) -> bool:
        if self.workflow_id and self.workflow_id not in (key.workflow_id, key.stream_id):
            return False
        if self.job_id and key.stream_id != self.job_id:
            return False
        if self.types and key.type not in self.types:
            return False
        if self.actor and key.actor != self.actor:
            return False
        return all(tag in key.tags for tag in self.tags)  # (name, value) pairs: tag name=value


def _read_page(resources: Resources, cursor: store.Cursor) -> list[Event]:
    with resources.read_connection() as conn:
        return store.read_after(conn, cursor, PAGE_SIZE)


def _tail(resources: Resources, back: int = 0) -> store.Cursor:
    with resources.read_connection() as conn:
        return store.tail_cursor(conn, back)


async def subscribe(resources: Resources, cursor: store.Cursor, filters: Filters,
                    still_allowed: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[bytes]:
    """Yield the matching events after `cursor` as SSE bytes, forever.

    Events come from the hub's shared cache when it reaches back to `cursor`,
    else from the log itself, one page at a time; either way the next batch is
    taken only once the previous one has been handed to the client, so a slow
    client slows only itself and holds at most one page. Every
    few seconds it asks `still_allowed` and ends once its token was revoked
    (within auth.STREAM_RECHECK_SECONDS).
    """
    hub = resources.hub
    checked = time.monotonic()
    while True:
        if still_allowed is not None and (time.monotonic() - checked
                                          >= auth.STREAM_RECHECK_SECONDS * (1 - auth.STREAM_VERDICT_SHARE)):
            checked = time.monotonic()
            try:
                if not await still_allowed():
                    return
            except (psycopg.OperationalError, PoolTimeout):
                pass  # the database is away: the reads below wait for it too
        changed = hub.changed()  # taken before reading: new events during the read are not lost
        # Unfiltered subscribers at the same cursor share the hub's batch (joined once).
        batch = hub.batch_after(cursor, PAGE_SIZE, filters.match if filters else None)
        if batch is None:  # behind the shared cache: read the log ourselves
            try:
                page = await run_in_threadpool(_read_page, resources, cursor)
            except (psycopg.OperationalError, PoolTimeout):
                await asyncio.sleep(1.0)  # the database is away; keep the client, retry
                continue
            # encode only what this client wants; the others just move the cursor
            keyed = ((event, key_of(event)) for event in page)
            batch = Batch(store.cursor_of(page[-1]) if page else cursor, len(page),
                          b"".join(encode(event, key).sse for event, key in keyed if filters.match(key)))
        full = batch.count == PAGE_SIZE
        cursor = batch.cursor
        if batch.sse:
            yield batch.sse  # one write for the whole batch
        if not full:
            try:  # asyncio.timeout, not wait_for: no task per wait and subscriber
                async with asyncio.timeout(IDLE_RECHECK_SECONDS):
                    await changed.wait()
            except TimeoutError:
                pass


class StreamLease:
    """One open stream of a token, counted against QFORGE_API_STREAMS_PER_TOKEN. Given back when
    the stream ends, or when a response that never started streaming is collected."""

    def __init__(self, counts: dict[str, int], name: str):
        self.counts, self.name, self.held = counts, name, True
        counts[name] = counts.get(name, 0) + 1

    @classmethod
    def take(cls, resources: Resources, name: str) -> "StreamLease":
        limit = resources.settings.api_streams_per_token
        if resources.open_streams.get(name, 0) >= limit:
            raise ApiError(429, "too_many_streams",
                           f"token '{name}' has {limit} streams open on this API process, the most"
                           " QFORGE_API_STREAMS_PER_TOKEN allows: close one first",
                           [{"limit": "QFORGE_API_STREAMS_PER_TOKEN", "value": limit}],
                           headers={"Retry-After": "5"})
        return cls(resources.open_streams, name)

    def release(self) -> None:
        if self.held:
            self.held = False
            left = self.counts.get(self.name, 1) - 1
            if left > 0:
                self.counts[self.name] = left
            else:
                self.counts.pop(self.name, None)

    def __del__(self) -> None:
        self.release()


async def counted(lease: StreamLease, messages: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for chunk in messages:
            yield chunk
    finally:
        lease.release()


@router.get("/events/stream", response_class=EventSourceResponse,
            responses={200: {"description": "text/event-stream: `id: <cursor>`, "
                                            "`event: <type>`, `data: <event JSON>` (an Event)",
                             "content": {"text/event-stream": {
                                 "schema": {"$ref": "#/components/schemas/Event"}}}}, **ERRORS})
async def stream(request: Request, after: cursor_query = None,
                 workflow_id: UUID | None = None, job_id: UUID | None = None,
                 tag: Annotated[list[str] | None, Query(max_length=20)] = None,
                 type: Annotated[list[str] | None, Query(
                     max_length=50, description="event types; repeat or comma-separate")] = None,
                 actor: Annotated[str | None, Query(max_length=200, description=(
                     "only events written by this actor (a token's name, a worker, the monitor)"))] = None,
                 backlog: Annotated[int, Query(
                     ge=0, le=1000, description="without a cursor: start this many events "
                                                "before the live tail")] = 0,
                 last_event_id: Annotated[str | None, Header(max_length=60)] = None,
                 ticket: Annotated[str | None, Query(max_length=500, description=(
                     "a ticket from POST /events/stream-ticket, for EventSource (which cannot set"
                     " headers)"))] = None,
                 token: Annotated[str | None, Query(max_length=500, description=(
                     "the API token itself; accepted only with QFORGE_STREAM_QUERY_TOKEN=true"))] = None,
                 *, who: Caller) -> EventSourceResponse:
    """Live events. Resumes after Last-Event-ID (or ?after=; "0" = from the beginning);
    without either it starts at the live tail (or `backlog` events before it). Filters: workflow_id, job_id, tag=key:value,
    type, actor. Never misses or repeats an event."""
    resources: Resources = request.app.state.resources
    types = {t.strip() for value in type or [] for t in value.split(",") if t.strip()}
    filters = Filters(workflow_id, job_id, tags_of(tag), types, actor)
    resume = last_event_id if last_event_id not in (None, "") else after
    if resume is not None:
        cursor = parse_cursor(resume)
    else:
        try:
            cursor = await run_in_threadpool(_tail, resources, backlog)
        except (psycopg.OperationalError, PoolTimeout):
            raise ApiError(503, "unavailable", "the database is not reachable right now") from None

    async def still_allowed() -> bool:
        return await auth.stream_still_allowed(request, who.name)

    lease = StreamLease.take(resources, who.name)
    return EventSourceResponse(counted(lease, subscribe(resources, cursor, filters, still_allowed)),
                               ping=PING_SECONDS,
                               send_timeout=SEND_TIMEOUT_SECONDS,
                               headers={"Cache-Control": "no-store"})


@router.post("/events/stream-ticket", response_model=StreamTicket, responses=ERRORS, **needs("read"))
def stream_ticket(request: Request, who: Caller) -> dict:
    """A short-lived ticket for GET /events/stream?ticket= (EventSource cannot send the token
    in a header, and a token in a URL ends up in logs). It opens the stream only, for
    QFORGE_STREAM_TICKET_SECONDS, and stops working when its token is revoked."""
    ticket, seconds = auth.issue_ticket(request, who)
    return {"ticket": ticket, "expires_in": seconds}
