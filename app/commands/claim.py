"""Claim a batch of jobs from given queues in one statement (see job_claim in jobs.sql)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import weakref
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, TypeVar
from uuid import UUID

from psycopg.rows import tuple_row

from qforge.commands import tx
from qforge.sql import q

T = TypeVar("T")


@dataclass(frozen=True)
class ClaimedJob:
    id: UUID
    task: str
    queue: str
    payload: dict[str, Any]
    attempt: int  # the fencing token every later report names
    timeout_seconds: float | None
    workflow_id: UUID | None
    step: str | None
    tags: dict[str, str]
    trace: dict[str, str] | None = None  # the enqueuer's trace context, for the run span


def claim(conn, queues: list[str], limit: int, worker: str, *,
          now: datetime | None = None) -> list[ClaimedJob]:
    """Lock, mark running and record Claimed for up to `limit` due jobs, highest priority first.

    One claim statement: job_claim_plain, or, when it finds jobs with a concurrency or fairness
    key in reach (it then claims nothing and says so with one row of nulls), job_claim. After
    such an answer this connection goes straight to job_claim for FLOW_MEMORY_SECONDS (either
    statement is right for any jobs: this only spares the plain one's round trip while keyed
    or fair jobs are about).
    """
    if limit <= 0 or not queues:
        return []
    params = {"queues": list(queues), "limit": limit, "worker": worker, "now": now}
    key = tuple(queues)
    generic = conn in _generic
    # Not pipelined: psycopg's pipeline mode saved round trips but cost more CPU than
    # they did (drain, 3 repetitions each on a quiet machine: 17,207 jobs/s without,
    # 14,471 with; workers + PostgreSQL 108 vs 125 µs per job).
    # In a transaction already (the worker's exchange, after its reports), the claim is part of it:
    # no savepoint (two round trips), as nobody goes on after a failed claim but rolls back. On a
    # connection that plans generically, a claim alone needs no transaction at all: each of its
    # statements is atomic by itself (a claim after a wake-up is then one round trip).
    scope = contextlib.nullcontext() if generic else tx.block(conn, join=True)
    with scope, conn.cursor(row_factory=tuple_row) as cur:
        if not generic:
            cur.execute(q("job_claim_plan"))
        rows = None
        if _flow_seen.get(conn, {}).get(key, -FLOW_MEMORY_SECONDS) + FLOW_MEMORY_SECONDS <= time.monotonic():
            rows = cur.execute(q("job_claim_plain"), params).fetchall()
            if len(rows) == 1 and rows[0][0] is None:
                _flow_seen.setdefault(conn, {})[key] = time.monotonic()
                rows = None
        if rows is None:
            rows = cur.execute(q("job_claim"), params).fetchall()
        return [_claimed(row) for row in rows]


def handed(item: dict[str, Any]) -> ClaimedJob:
    """A job claimed for this worker by the statement that created it (jobs_hand, 34_wake.sql),
    from one element of its notification: what a claim returns, as JSON."""
    values = {name: item.get(name) for name in _CLAIMED_FIELDS}  # no workflow_id: never a step's
    values["id"] = UUID(values["id"])
    return frozen_record(ClaimedJob, values)


def handed_by_id(conn, ids: list[UUID], worker: str) -> list[ClaimedJob]:
    """The jobs handed to `worker` whose notification named only their ids (too long to carry them)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        return [_claimed(row) for row in cur.execute(q("job_handed"), {"ids": ids, "worker": worker})]


def _claimed(row: tuple) -> ClaimedJob:
    """ClaimedJob(*row), once per claimed job (see frozen_record)."""
    return frozen_record(ClaimedJob, zip(_CLAIMED_FIELDS, row))


def frozen_record(cls: type[T], values: Iterable[tuple[str, Any]] | dict[str, Any]) -> T:
    """An instance of the frozen dataclass `cls` from `values` (name -> value, for at least every
    field without a default), without its __init__: that sets each field through
    object.__setattr__, which costs more than filling the instance's dict (ClaimedJob: 1.3 -> 0.8 µs).
    For the worker's per-job records (claimed jobs, success reports)."""
    record = object.__new__(cls)
    record.__dict__.update(_defaults(cls))
    record.__dict__.update(values)
    return record


@functools.cache
def _defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


_CLAIMED_FIELDS = tuple(f.name for f in dataclasses.fields(ClaimedJob))
FLOW_MEMORY_SECONDS = 1.0
# connection -> queues -> when job_claim_plain last said "not plain" (time.monotonic())
_flow_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def plan_generically(conn) -> None:
    """For a connection that claims over and over (a worker's): plan every statement once for the
    session (see job_claim_plan_session), so that its claims skip job_claim_plan and, alone, their
    transaction."""
    conn.execute(q("job_claim_plan_session"))
    _generic.add(conn)


# connections set up by plan_generically
_generic: weakref.WeakSet = weakref.WeakSet()
