"""Enqueue one job or a batch: one Enqueued event per new job, idempotent on a key."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from psycopg.rows import tuple_row

from qforge.commands.specs import JobSpec
from qforge.events.ids import new_ids
from qforge.events.types import Enqueued
from qforge.sql import q


@dataclass(frozen=True)
class EnqueueResult:
    id: uuid.UUID
    created: bool  # False: an existing job with the same idempotency_key


def run_at_of(spec: JobSpec, now: datetime) -> datetime | None:
    """When a job is due; None: as soon as it is enqueued."""
    if spec.run_at is not None:
        return spec.run_at
    if spec.delay_seconds:
        return now + timedelta(seconds=spec.delay_seconds)
    return None


def enqueued_data(spec: JobSpec, now: datetime) -> Enqueued:
    """The Enqueued event of a plain job."""
    return Enqueued(task=spec.task, queue=spec.queue, priority=spec.priority,
                    max_retries=spec.max_retries, run_at=run_at_of(spec, now), payload=spec.payload,
                    timeout_seconds=spec.timeout_seconds, idempotency_key=spec.idempotency_key)


def enqueue(conn, specs: list[JobSpec], *, actor: str = "api",
            now: datetime | None = None) -> list[EnqueueResult]:
    """Enqueue jobs in one statement; a repeated idempotency_key returns the existing job."""
    if not specs:
        return []
    clock = now or datetime.now(timezone.utc)
    ids = new_ids(len(specs))
    rows = [job_row(job_id, enqueued_data(spec, clock), spec.tags) for job_id, spec in zip(ids, specs)]
    keyed = any(spec.idempotency_key is not None for spec in specs)
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(q("job_enqueue"), {"jobs": json.dumps(rows), "actor": actor, "now": now})
        if not keyed:  # nothing can conflict: every job is new (skip parsing RETURNING)
            return [EnqueueResult(job_id, True) for job_id in ids]
        inserted = {row[0] for row in cur.fetchall()}
        missing_keys = [spec.idempotency_key for spec, job_id in zip(specs, ids)
                        if job_id not in inserted]
        existing: dict[str, uuid.UUID] = {}
        if missing_keys:
            # ON CONFLICT waited for the other writer, so its job is visible now.
            cur.execute(q("job_ids_by_idempotency_key"), {"keys": missing_keys})
            existing = {key: job_id for job_id, key in cur.fetchall()}
    return [EnqueueResult(job_id, True) if job_id in inserted
            else EnqueueResult(existing[spec.idempotency_key], False)
            for spec, job_id in zip(specs, ids)]


def job_row(job_id: uuid.UUID, data: Enqueued, tags: dict[str, str],
            workflow_id: uuid.UUID | None = None) -> dict[str, Any]:
    """A row of job_enqueue's input. Fields at their defaults are left out: most jobs are
    {"task": ...} and nothing more (the defaults are part of the event's schema)."""
    return {"id": str(job_id), "data": data.model_dump(mode="json", exclude_defaults=True), "tags": tags,
            "workflow_id": str(workflow_id) if workflow_id else None}
