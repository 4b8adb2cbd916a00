"""Read-your-writes across a primary and a hot standby, by WAL position (LSN).

A write's LSN is taken on the primary after it commits; a read that must see
it waits, with a bound, until the standby has replayed that far. LSNs travel
as PostgreSQL writes them (``16/B374D848``) and compare as integers.
"""

from __future__ import annotations

import asyncio
import re
import time

import psycopg

from qforge.sql import q

_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
POLL_SECONDS = 0.005  # how often a waiting read looks again at the standby's replay position


def parse_lsn(text: str | None) -> int | None:
    """``'16/B374D848'`` -> an integer; None for missing or malformed text (a client's header is only a hint)."""
    match = _LSN.match(text.strip()) if text else None
    if match is None:
        return None
    return (int(match.group(1), 16) << 32) | int(match.group(2), 16)


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def write_lsn(conn: psycopg.Connection) -> int:
    """The primary's WAL position now: at or past every write this connection committed."""
    row = conn.execute(q("replication_write_lsn")).fetchone()
    lsn = parse_lsn(row[0] if isinstance(row, tuple) else row["lsn"])
    assert lsn is not None
    return lsn


def wait_replayed(conn: psycopg.Connection, lsn: int, timeout: float) -> bool:
    """Wait up to `timeout` s until the server behind `conn` has replayed `lsn`; whether it has."""
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute(q("replication_replayed"), {"lsn": format_lsn(lsn)}).fetchone()
        if row[0] if isinstance(row, tuple) else row["replayed"]:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)


async def wait_replayed_async(conn: psycopg.AsyncConnection, lsn: int, timeout: float) -> bool:
    """`wait_replayed` for the event hub's async connection."""
    deadline = time.monotonic() + timeout
    while True:
        cur = await conn.execute(q("replication_replayed"), {"lsn": format_lsn(lsn)})
        row = await cur.fetchone()
        if row[0] if isinstance(row, tuple) else row["replayed"]:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(POLL_SECONDS)


async def write_lsn_async(conn: psycopg.AsyncConnection) -> int:
    cur = await conn.execute(q("replication_write_lsn"))
    row = await cur.fetchone()
    lsn = parse_lsn(row[0] if isinstance(row, tuple) else row["lsn"])
    assert lsn is not None
    return lsn
