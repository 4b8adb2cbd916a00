"""Keyset cursors for list pages: an opaque token naming the last row of a page."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from uuid import UUID


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
