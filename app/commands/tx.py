"""The transaction a command's statements run in."""

from __future__ import annotations

import contextlib
from typing import ContextManager

from psycopg.pq import TransactionStatus


def block(conn, *, join: bool) -> ContextManager:
    """Its own transaction (a savepoint inside the caller's), or, with `join` and a transaction
    already open, none: the statements join the caller's. Joining saves the savepoint's two round
    trips; it is for callers that roll their whole transaction back when a command fails, since
    the failed statement leaves it unusable (the worker's exchange, the claim)."""
    if join and conn.info.transaction_status == TransactionStatus.INTRANS:
        return contextlib.nullcontext()
    return conn.transaction()
