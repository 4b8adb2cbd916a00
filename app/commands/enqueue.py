"""Enqueue one job or a batch: one Enqueued event per new job, idempotent on a key."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from qforge import tracing
from qforge.commands.plan import Last, Plan, Statement, run
from qforge.commands.specs import JobSpec, parse_batch
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


# The defaults of the Enqueued event's fields: a field at its default is not stored.
_DEFAULTS = {name: field.get_default(call_default_factory=True)
             for name, field in Enqueued.model_fields.items() if not field.is_required()}
# The fields a plain job's spec gives its Enqueued event as they are (run_at is computed).
_SPEC_FIELDS = ("queue", "priority", "max_retries", "payload", "timeout_seconds", "idempotency_key",
                "concurrency_key", "concurrency_limit", "fairness_key")


def enqueued_data(spec: JobSpec, now: datetime, trace: dict[str, str] | None = None) -> dict[str, Any]:
    """The Enqueued event's data of a plain job, as stored: JSON-ready, fields at their
    defaults left out. Built straight from the validated spec, without a model round trip
    (this is enqueue's hot path); a test checks it is what Enqueued(...) dumps."""
    data: dict[str, Any] = {"task": spec.task}
    for name in _SPEC_FIELDS:
        value = getattr(spec, name)
        if value != _DEFAULTS[name]:
            data[name] = value
    run_at = run_at_of(spec, now)
    if run_at is not None:
        data["run_at"] = run_at.isoformat()
    if trace:
        data["trace"] = trace
    return data


# Jobs per statement when a batch is large: the statements of one batch are sent
# in a pipeline, so the database folds one part while this process prepares the
# next (one transaction: the whole batch or none of it).
PART = 250


def enqueue(conn, specs: list[JobSpec], *, actor: str = "api",
            now: datetime | None = None) -> list[EnqueueResult]:
    """Enqueue jobs, atomically; a repeated idempotency_key returns the existing job."""
    with tracing.enqueue_span(**span_attributes(specs)) as traced:
        results = run(conn, enqueue_plan(specs, actor=actor, now=now, trace=traced.carrier))
        if len(results) == 1:
            traced.set(job_id=results[0].id)
    return results


def span_attributes(specs: list[JobSpec]) -> dict[str, Any]:
    """The qforge.enqueue span's attributes: task and queue when the batch has one of each."""
    tasks, queues = {spec.task for spec in specs}, {spec.queue for spec in specs}
    return {"task": next(iter(tasks)) if len(tasks) == 1 else None,
            "queue": next(iter(queues)) if len(queues) == 1 else None, "count": len(specs)}


def batch_attributes(shared: JobSpec, payloads: list) -> dict[str, Any]:
    """The qforge.enqueue span's attributes of an enqueue_many batch."""
    return {**span_attributes([shared]), "count": len(payloads)}


def enqueue_plan(specs: list[JobSpec], *, actor: str = "api", now: datetime | None = None,
                 trace: dict[str, str] | None = None) -> Plan[list[EnqueueResult]]:
    """enqueue() as a plan (qforge.commands.plan), so qforge.enqueue can run it in the caller's
    transaction, sync or async. `trace`: the enqueuer's trace context, stored in every job."""
    if not specs:
        return []
    clock = now or datetime.now(timezone.utc)
    ids = new_ids(len(specs))
    keyed = any(spec.idempotency_key is not None for spec in specs)
    query = q("job_enqueue_keyed" if keyed else "job_enqueue")
    parts = [range(start, min(start + PART, len(specs))) for start in range(0, len(specs), PART)]
    statements = (Statement(query, {"jobs": json.dumps([job_row(ids[i], enqueued_data(specs[i], clock, trace),
                                                                specs[i].tags) for i in part]),
                                    "actor": actor, "now": now}, fetch=keyed)
                  for part in parts)
    # Lazy when there are several parts: each is built while the database folds the one before.
    # Without idempotency keys nothing follows the statements.
    results = yield ((Last if not keyed else list)(statements) if len(parts) == 1 else statements)
    if not keyed:  # nothing can conflict: every job is new (no RETURNING to read)
        return [EnqueueResult(job_id, True) for job_id in ids]
    inserted = {row[0] for rows in results for row in rows}
    missing_keys = [spec.idempotency_key for spec, job_id in zip(specs, ids) if job_id not in inserted]
    existing: dict[str, uuid.UUID] = {}
    if missing_keys:
        # ON CONFLICT waited for the other writer, so its job is visible now.
        [rows] = yield [Statement(q("job_ids_by_idempotency_key"), {"keys": missing_keys}, fetch=True)]
        existing = {key: job_id for job_id, key in rows}
    return [EnqueueResult(job_id, True) if job_id in inserted
            else EnqueueResult(existing[spec.idempotency_key], False)
            for spec, job_id in zip(specs, ids)]


def enqueue_many(conn, task: str, payloads: list[dict[str, Any] | None], *, actor: str = "api",
                 now: datetime | None = None, **options: Any) -> list[uuid.UUID]:
    """Enqueue one job per payload, atomically, all of task `task` with the same options (those of
    POST /jobs but idempotency_key); their ids, in order. Validated once per batch (parse_batch)."""
    shared, payloads = parse_batch(task, payloads, options)
    with tracing.enqueue_span(**batch_attributes(shared, payloads)) as traced:
        return run(conn, enqueue_many_plan(shared, payloads, actor=actor, now=now, trace=traced.carrier))


def enqueue_many_plan(shared: JobSpec, payloads: list[dict[str, Any] | None], *, actor: str = "api",
                      now: datetime | None = None, trace: dict[str, str] | None = None) -> Plan[list[uuid.UUID]]:
    """enqueue_many() as a plan. The jobs' Enqueued data is the shared spec's, sent once, plus each
    job's payload, added by the statement (job_enqueue_many): no document is built per job here,
    and the database parses none for a job without a payload."""
    if not payloads:
        return []
    ids = new_ids(len(payloads))
    data = json.dumps(enqueued_data(shared, now or datetime.now(timezone.utc), trace))
    tags = json.dumps(shared.tags) if shared.tags else None
    parts = [range(start, min(start + PART, len(ids))) for start in range(0, len(ids), PART)]
    statements = (Statement(q("job_enqueue_many"), {
        "ids": "{" + ",".join([job_id.hex for job_id in ids[part.start:part.stop]]) + "}",
        # null for a part without payloads: the statement's ROWS FROM pads them with nulls
        "payloads": json.dumps(payloads[part.start:part.stop]) if any(payloads[part.start:part.stop]) else None,
        "data": data, "tags": tags, "actor": actor, "now": now}) for part in parts)
    yield Last(statements) if len(parts) == 1 else statements
    return ids


def job_row(job_id: uuid.UUID, data: Enqueued | dict[str, Any], tags: dict[str, str],
            workflow_id: uuid.UUID | None = None) -> dict[str, Any]:
    """A row of job_enqueue's input. Fields at their defaults are left out: most jobs are
    {"task": ...} and nothing more (the defaults are part of the event's schema)."""
    if isinstance(data, Enqueued):
        data = data.model_dump(mode="json", exclude_defaults=True)
    return {"id": str(job_id), "data": data, "tags": tags,
            "workflow_id": str(workflow_id) if workflow_id else None}


def enqueued_event(row: dict[str, Any]) -> dict[str, Any]:
    """A job_row as the row events_append takes: the Enqueued event job_enqueue would write for it
    (its data as stored there), for a caller that appends it with other events in one statement."""
    return {"stream_type": "job", "stream_id": row["id"], "version": 1, "type": Enqueued.type,
            "schema_version": Enqueued.schema_version, "data": row["data"], "tags": row["tags"],
            "workflow_id": row["workflow_id"], "actor": None}
