"""Commands written once as plans, run by a sync or an async driver, in a transaction of their own
or inside the caller's.

A plan is a generator: it yields batches of statements (Statements in a list, or
in a lazy iterable that the driver reads inside the pipeline) and
receives, for each batch, the rows of the statements that fetch (None for the
others); its return value is the command's result. A batch of several statements
is sent in a pipeline, so the database works on one while the next is prepared.
No I/O happens in a plan, so the same plan runs on a psycopg Connection and on an
AsyncConnection.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Generator, Iterable, TypeVar

from psycopg import AsyncConnection, Connection
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

T = TypeVar("T")


@dataclass(frozen=True)
class Statement:
    query: str
    params: dict[str, Any]
    fetch: bool = False  # the plan needs its rows


Plan = Generator[Iterable[Statement], list, T]


class Last(list):
    """A batch after which the plan asks for nothing more (it returns on the rows). A Last batch of
    one statement that is also the plan's first runs without BEGIN and COMMIT on an autocommit
    connection with no transaction open: one statement is atomic by itself, and the two round
    trips were a third of a one-job enqueue's time."""


def _pipelined(batch: Iterable[Statement]) -> bool:
    """A batch goes through a pipeline unless it is a list of one statement. A lazy batch is
    built while the database works on its first statements (enqueue's large batches)."""
    return not (isinstance(batch, list) and len(batch) == 1)


def _joins_caller(conn: Connection | AsyncConnection) -> bool:
    """True when the statements should simply run on the connection: it is not in autocommit and
    has no transaction yet, so the first statement starts the caller's (implicit) transaction.
    `conn.transaction()` there would begin AND COMMIT a transaction of its own, which is exactly
    what "enqueue in the caller's transaction" must not do."""
    return not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE


def _alone(conn: Connection | AsyncConnection, batch: Iterable[Statement]) -> bool:
    """The plan's first batch is its last and one statement, and the connection commits each
    statement by itself (autocommit, no transaction open): run it as it is (see Last)."""
    return (isinstance(batch, Last) and len(batch) == 1 and conn.autocommit
            and conn.info.transaction_status == TransactionStatus.IDLE)


def _block(conn: Connection | AsyncConnection, first: Iterable[Statement], own_transaction: bool):
    """The plan's transaction: none where the statements join the caller's (see _joins_caller) or
    the only statement runs alone (see Last), else conn.transaction()."""
    if (not own_transaction and _joins_caller(conn)) or _alone(conn, first):
        return contextlib.nullcontext()
    return conn.transaction()


def run(conn: Connection, plan: Plan[T], *, own_transaction: bool = True) -> T:
    """Run a plan. own_transaction=True (the API, the CLI): one transaction, committed here, or a
    savepoint if the caller has one open. False (qforge.enqueue): inside the caller's transaction;
    a savepoint when one is open (so a failed statement leaves it usable), and no block at all when
    the connection is idle, so the work commits or rolls back with the caller's next statement."""
    try:
        batch = next(plan)
    except StopIteration as done:  # nothing to run (the plan's own code does no I/O)
        return done.value
    with _block(conn, batch, own_transaction):
        try:
            while True:
                with conn.pipeline() if _pipelined(batch) else contextlib.nullcontext():
                    sent = []
                    for statement in batch:
                        cursor = conn.cursor(row_factory=tuple_row)
                        cursor.execute(statement.query, statement.params)
                        sent.append((statement, cursor))
                results = [cursor.fetchall() if statement.fetch else None for statement, cursor in sent]
                batch = plan.send(results)
        except StopIteration as done:
            return done.value


async def run_async(conn: AsyncConnection, plan: Plan[T], *, own_transaction: bool = True) -> T:
    """run() for an AsyncConnection: the same plan, the same transaction rules."""
    try:
        batch = next(plan)
    except StopIteration as done:
        return done.value
    async with _async_block(_block(conn, batch, own_transaction)):
        try:
            while True:
                async with conn.pipeline() if _pipelined(batch) else _async_block(contextlib.nullcontext()):
                    sent = []
                    for statement in batch:
                        cursor = conn.cursor(row_factory=tuple_row)
                        await cursor.execute(statement.query, statement.params)
                        sent.append((statement, cursor))
                results = [await cursor.fetchall() if statement.fetch else None for statement, cursor in sent]
                batch = plan.send(results)
        except StopIteration as done:
            return done.value


@contextlib.asynccontextmanager
async def _async_block(block):
    """An async context for either a transaction() (async) or a nullcontext (sync)."""
    if hasattr(block, "__aenter__"):
        async with block:
            yield
    else:
        with block:
            yield
