"""Keyset cursors for list pages: an opaque token naming the last row of a page."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from qforge.sql import q

FETCH_ROWS = 10  # rows a bounded page fetches at a time


def encode_page_cursor(created_at: datetime, row_id: UUID) -> str:
    raw = f"{created_at.isoformat()}|{row_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_page_cursor(token: str | None) -> tuple[datetime | None, UUID | None]:
    """(created_at, id) of the row a page starts after; (None, None) for the first page.

    ValueError when the token was not made by encode_page_cursor.
    """
    if token is None or token == "":
        return None, None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        created, sep, row_id = raw.partition("|")
        if not sep:
            raise ValueError
        moment = datetime.fromisoformat(created)
        if moment.tzinfo is None:
            raise ValueError
        return moment, UUID(row_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValueError(f"malformed cursor {token[:80]!r}: pass back the 'next' of a previous page") from None


def parse_tags(pairs: list[str] | None) -> list[tuple[str, str]]:
    """["k:v", ...] -> [("k", "v"), ...] without repeats; ValueError names a malformed pair.

    The value may contain ':' (only the first one splits). The same key with two
    values is kept: nothing carries both, so a search for them finds nothing.
    """
    tags: list[tuple[str, str]] = []
    for pair in pairs or []:
        key, sep, value = pair.partition(":")
        if not sep or not key:
            raise ValueError(f"tag {pair[:100]!r} must look like key:value")
        if (key, value) not in tags:
            tags.append((key, value))
    return tags


def as_mapping(tags: list[tuple[str, str]]) -> dict[str, str] | None:
    """The tags as one object, or None when a key has two values (nothing can match)."""
    mapping: dict[str, str] = {}
    for key, value in tags:
        if mapping.setdefault(key, value) != value:
            return None
    return mapping


def fetch_page(conn, query: str, params: dict[str, Any], *, tags: list[tuple[str, str]] | None,
               limit: int, cursor: str | None,
               max_bytes: int | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """One keyset page of a list query filtered by tags: (rows, next cursor or None).

    The query takes tag_key/tag_value (the first tag, an index range of
    execution_tags), tags (all of them, as jsonb), after_created/after_id and limit.
    ValueError for a malformed cursor.
    """
    after_created, after_id = decode_page_cursor(cursor)
    wanted = as_mapping(tags or [])
    if wanted is None:  # the same key asked with two values: nothing can match
        return [], None
    first = next(iter(wanted.items()), (None, None))
    values = {**params, "tag_key": first[0], "tag_value": first[1], "tags": json.dumps(wanted),
              "after_created": after_created, "after_id": after_id, "limit": limit + 1}
    if max_bytes is None:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(q(query), values)
            rows = cur.fetchall()
        more = len(rows) > limit
        rows = rows[:limit]
    else:
        rows, more = bounded_rows(conn, q(query), values, limit, max_bytes)
    return rows, (encode_page_cursor(rows[-1]["created_at"], rows[-1]["id"]) if more else None)


def row_bytes(row: dict[str, Any]) -> int:
    """About how many bytes of JSON a row becomes."""
    return len(json.dumps(row, default=str))


def bounded_rows(conn, query: str, values: dict[str, Any], limit: int, max_bytes: int) -> tuple[list[dict], bool]:
    """At most `limit` rows of `query`, fewer once they hold about `max_bytes` of JSON (at least one),
    and whether more follow. Fetched a few at a time through a server-side cursor, so a page of
    large payloads never sits in memory whole (500 rows of 1 MiB each would be half a GB)."""
    rows: list[dict] = []
    size, more = 0, False
    with conn.transaction(), conn.cursor(name="qforge_bounded_page", row_factory=dict_row) as cur:
        cur.itersize = FETCH_ROWS
        cur.execute(query, values)
        for row in cur:
            weight = row_bytes(row)
            if len(rows) == limit or (rows and size + weight > max_bytes):
                more = True
                break
            rows.append(row)
            size += weight
    return rows, more
