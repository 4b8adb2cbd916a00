"""The event store: append, read a stream, read the global log through a gapless cursor."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Iterable
from uuid import UUID

from psycopg.rows import dict_row

from psycopg.rows import tuple_row
from qforge.events.types import Event, NewEvent
from qforge.sql import q

EVENTS_CHANNEL = "qforge_events"
JOBS_CHANNEL = "qforge_jobs"


def append(conn, events: Iterable[NewEvent], *, actor: str = "system",
           now: datetime | None = None) -> list[int]:
    """Append events (their streams locked by the caller); returns their positions."""
    return append_rows(conn, [event.row() for event in events], actor=actor, now=now)


def append_rows(conn, rows: list[dict], *, actor: str = "system", now: datetime | None = None) -> list[int]:
    """append, for events already made rows (NewEvent.row(), or enqueue.enqueued_event)."""
    if not rows:
        return []
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(q("events_append"), {"events": json.dumps(rows), "actor": actor, "now": now})
        return [row[0] for row in cur.fetchall()]


def _events(conn, query: str, params: dict) -> list[Event]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q(query), params)
        return [Event.from_row(row) for row in cur.fetchall()]


def read_stream(conn, stream_id: UUID) -> list[Event]:
    return _events(conn, "events_of_stream", {"stream_id": stream_id})


def read_workflow(conn, workflow_id: UUID) -> list[Event]:
    """A workflow's own events and its steps' job events, in log order."""
    return _events(conn, "events_of_workflow", {"workflow_id": workflow_id})


# A cursor is (xid, position) of the last event read, encoded "xid-position".
Cursor = tuple[int, int]
START: Cursor = (0, 0)


def encode_cursor(cursor: Cursor) -> str:
    return f"{cursor[0]}-{cursor[1]}"


def decode_cursor(text: str | None) -> Cursor:
    """Parse a cursor; "0" (or empty) is the start of the log. ValueError if malformed."""
    if text is None or text.strip() in ("", "0"):
        return START
    xid, sep, position = text.strip().partition("-")
    if not sep or not xid.isdigit() or not position.isdigit():
        raise ValueError(f"malformed cursor {text!r}: expected 'XID-POSITION' or '0'")
    return int(xid), int(position)


def read_after(conn, cursor: Cursor, limit: int = 500) -> list[Event]:
    """Events after `cursor` that no in-flight transaction can still precede."""
    return _events(conn, "events_after", {
        "after_xid": str(cursor[0]), "after_position": cursor[1], "limit": limit,
    })


def tail_cursor(conn, back: int = 0) -> Cursor:
    """The cursor of the live tail, or of `back` events before it (the start if fewer)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(q("events_tail_cursor"), {"back": back})
        row = cur.fetchone()
    return START if row is None else (int(row[0]), int(row[1]))


def cursor_of(event: Event) -> Cursor:
    return event.xid, event.position
