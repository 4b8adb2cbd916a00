"""Executions that left the read model for the archive: which segments hold an id."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from qforge.sql import q


def segments_holding(conn, stream_id: UUID) -> list[dict[str, Any]]:
    """The archive segments whose Bloom filter has `stream_id`, oldest first (almost
    always exactly those that hold its events; see archive_bloom_has)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("archive_holding"), {"id": stream_id})
        return cur.fetchall()
