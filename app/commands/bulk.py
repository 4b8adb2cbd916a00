"""Bulk cancel and retry: every job matching a filter, in batches of bounded size, each batch a
transaction of its own whose events carry the batch's id."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Literal

from psycopg.rows import dict_row
from pydantic import ConfigDict, Field, StrictBool, StrictInt, field_validator

from qforge.workflows.engine import advance
from qforge.commands.errors import Conflict, Invalid
from qforge.workflows.resume import reopen_step
from qforge.commands.specs import NAME_PATTERN, Storable, check_tags
from qforge.events import store
from qforge.events import types as ev
from qforge.events.ids import new_id
from qforge.events.states import JOB_ACTIVE, JOB_TRANSITIONS, statuses
from qforge.events.transitions import job_cancelled, job_retried_by_hand
from qforge.sql import q

# Jobs one batch (one transaction) acts on: short enough that no transaction holds many row
# locks or a long snapshot, big enough that 100,000 jobs take a few hundred round trips.
BATCH_SIZE = 500
MAX_LIMIT = 1_000_000

Action = Literal["cancel", "retry"]
_EVENT = {"cancel": ev.Cancelled.type, "retry": ev.Retried.type}


def action_statuses(action: Action) -> list[str]:
    """The statuses a job can be in for the action to apply (from the state machine): cancel
    what has not finished; retry what is dead or cancelled (never an active job)."""
    found = {source for (source, event), _ in JOB_TRANSITIONS.items() if event == _EVENT[action] and source}
    if action == "retry":
        found -= JOB_ACTIVE
    return sorted(found)


class JobFilter(Storable):
    """Which jobs: all of the given fields must match (no field: every job the action applies to)."""

    model_config = ConfigDict(extra="forbid")

    status: str | None = Field(default=None, description="one status the action applies to")
    queue: str | None = Field(default=None, pattern=NAME_PATTERN)
    task: str | None = Field(default=None, min_length=1, max_length=200)
    tags: dict[str, str] = Field(default_factory=dict, description="all of these key: value tags")

    @field_validator("status")
    @classmethod
    def _status(cls, value: str | None) -> str | None:
        if value is not None and value not in statuses("job"):
            raise ValueError(f"unknown job status {value!r}; one of {', '.join(sorted(statuses('job')))}")
        return value

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: dict[str, str]) -> dict[str, str]:
        return check_tags(tags)


class BulkRequest(Storable):
    """`{"filter": {...}}` acts on every matching job. `dry_run` only counts them; `limit` and
    `after` let a caller go through them in parts (the answer's `next` is the next `after`)."""

    model_config = ConfigDict(extra="forbid")

    filter: JobFilter
    dry_run: StrictBool = False
    limit: StrictInt | None = Field(default=None, ge=1, le=MAX_LIMIT,
                              description="look at most this many matching jobs (then `next` is set)")
    after: uuid.UUID | None = Field(default=None, description="start after this job id (a previous `next`)")


@dataclass(frozen=True)
class BulkOutcome:
    count: int  # jobs acted on (or, for a dry run, that match)
    next: uuid.UUID | None = None  # with a limit that was reached: where to go on
    batches: int = 0


def _params(action: Action, job_filter: JobFilter) -> dict:
    allowed = action_statuses(action)
    if job_filter.status is not None:
        if job_filter.status not in allowed:
            raise Invalid(f"filter.status: a {job_filter.status} job cannot be {action}ed "
                          f"(the {action} applies to {', '.join(allowed)})",
                          [{"field": "filter.status", "message": f"{action} applies to {', '.join(allowed)}"}])
        allowed = [job_filter.status]
    return {"statuses": allowed, "queue": job_filter.queue, "task": job_filter.task,
            "tags": json.dumps(job_filter.tags)}


def count_matching(conn, action: Action, job_filter: JobFilter) -> int:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("jobs_bulk_count"), _params(action, job_filter))
        return cur.fetchone()["count"]


def bulk(conn, action: Action, job_filter: JobFilter, *, actor: str = "api", limit: int | None = None,
         after: uuid.UUID | None = None, batch_size: int = BATCH_SIZE, now: datetime | None = None,
         progress: Callable[[int], None] | None = None) -> BulkOutcome:
    """Cancel or retry every job matching the filter, batch by batch (each its own transaction,
    its events carrying the batch's id). A job that changed between the batch's read and its
    lock is left alone, as is a step whose workflow cannot take it again (a retry of a step of a
    succeeded workflow); neither is counted."""
    params = _params(action, job_filter)
    count = batches = looked = 0
    while limit is None or looked < limit:
        size = batch_size if limit is None else min(batch_size, limit - looked)
        acted, seen, last = _batch(conn, action, params, after, size, actor=actor, now=now)
        if seen:
            batches += 1
            count += acted
            looked += seen
            after = last
            if progress is not None:
                progress(count)
        if seen < size:  # every match was seen
            return BulkOutcome(count, None, batches)
    return BulkOutcome(count, after, batches)


def _batch(conn, action: Action, params: dict, after: uuid.UUID | None, size: int, *, actor: str,
           now: datetime | None) -> tuple[int, int, uuid.UUID | None]:
    """One batch: (jobs acted on, jobs looked at, the last id looked at)."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("jobs_bulk_candidates"), {**params, "after": after, "limit": size})
        candidates = cur.fetchall()
        if not candidates:
            return 0, 0, None
        ids = [row["id"] for row in candidates]
        # the global lock order: workflows first, then their jobs, each in id order
        workflow_ids = sorted({row["workflow_id"] for row in candidates if row["workflow_id"]})
        if workflow_ids:
            cur.execute(q("workflow_lock"), {"ids": workflow_ids})
        cur.execute(q("job_lock"), {"ids": ids})
        locked = [row for row in cur.fetchall() if row["status"] in params["statuses"]]
        batch_id = new_id()
        if action == "cancel":
            _cancel(conn, locked, batch_id, actor=actor, now=now)
        else:
            _retry(conn, cur, locked, batch_id, actor=actor, now=now)
        cur.execute(q("job_lock"), {"ids": [row["id"] for row in locked]})
        # what left the action's statuses was acted on (by its own event, or a step by the
        # reopening of an earlier step of this batch, whose events carry the same batch id)
        acted = sum(1 for row in cur.fetchall() if row["status"] not in params["statuses"])
        return acted, len(ids), ids[-1]


def _cancel(conn, rows: list[dict], batch_id: uuid.UUID, *, actor: str, now: datetime | None) -> None:
    store.append(conn, [event for row in rows
                        for event in job_cancelled(row, f"cancelled by {actor} (bulk)", batch_id=batch_id)],
                 actor=actor, now=now)
    workflow_ids = sorted({row["workflow_id"] for row in rows if row["workflow_id"]})
    if workflow_ids:
        advance(conn, workflow_ids, now=now, actor=actor)


def _retry(conn, cur, rows: list[dict], batch_id: uuid.UUID, *, actor: str, now: datetime | None) -> None:
    clock = now or datetime.now(timezone.utc)
    plain = [row for row in rows if not row["workflow_id"]]
    store.append(conn, [event for row in plain for event in job_retried_by_hand(row, clock, batch_id=batch_id)],
                 actor=actor, now=now)
    for row in rows:
        if not row["workflow_id"]:
            continue
        # an earlier step of this batch may have reopened this one with what it took down
        cur.execute(q("job_get"), {"id": row["id"]})
        if cur.fetchone()["status"] not in action_statuses("retry"):
            continue
        try:
            reopen_step(conn, cur, row["workflow_id"], row["step"], actor=actor, now=now, batch_id=batch_id)
        except Conflict:
            continue  # its workflow succeeded: nothing of it runs again (as POST /jobs/{id}/retry says)
