"""Enqueue one job or a batch: one Enqueued event per new job, idempotent on a key."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from psycopg.rows import tuple_row
from app.events.ids import new_ids
from app.sql import q

NAME_PATTERN = r"^[A-Za-z0-9_.:\-]{1,200}$"


class JobSpec(BaseModel):
    """What a caller asks for (POST /jobs)."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, max_length=200)
    payload: dict[str, Any] = Field(default_factory=dict)
    queue: str = Field(default="default", pattern=NAME_PATTERN)
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    max_retries: int = Field(default=3, ge=0, le=1000)
    run_at: datetime | None = None
    delay_seconds: float | None = Field(default=None, ge=0, le=10 * 365 * 86400)
    timeout_seconds: float | None = Field(default=None, gt=0, le=7 * 86400)
    tags: dict[str, str] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)

    @field_validator("tags")
    @classmethod
    def _tags_are_searchable(cls, tags: dict[str, str]) -> dict[str, str]:
        for key, value in tags.items():
            if not key or ":" in key or len(key) > 100 or len(value) > 200:
                raise ValueError(
                    f"tag {key!r}: keys must be 1-100 characters without ':', values at most 200")
        return tags

    @field_validator("run_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)  # naive times are UTC
        return value

    @model_validator(mode="after")
    def _one_schedule(self) -> "JobSpec":
        if self.run_at is not None and self.delay_seconds is not None:
            raise ValueError("give run_at or delay_seconds, not both")
        return self


@dataclass(frozen=True)
class Enqueued:
    id: uuid.UUID
    created: bool  # False: an existing job with the same idempotency_key


def enqueued_data(spec: JobSpec, now: datetime, status: str = "pending", *,
                  now_iso: str | None = None, **step: Any) -> dict[str, Any]:
    """The Enqueued event's data for a spec (workflow steps add their step fields).

    `now_iso` is `now.isoformat()` when the caller already has it (a batch
    formats its clock once, not once per job)."""
    if spec.run_at is not None:
        run_at = spec.run_at.isoformat()
    elif spec.delay_seconds:
        run_at = (now + timedelta(seconds=spec.delay_seconds)).isoformat()
    else:
        run_at = now_iso or now.isoformat()
    data: dict[str, Any] = {
        "task": spec.task, "queue": spec.queue, "priority": spec.priority,
        "max_retries": spec.max_retries, "run_at": run_at,
        "payload": spec.payload, "status": status,
    }
    if spec.timeout_seconds is not None:
        data["timeout_seconds"] = spec.timeout_seconds
    if spec.idempotency_key is not None:
        data["idempotency_key"] = spec.idempotency_key
    data.update({k: v for k, v in step.items() if v is not None})
    return data


def enqueue(conn, specs: list[JobSpec], *, actor: str = "api",
            now: datetime | None = None) -> list[Enqueued]:
    """Enqueue jobs in one statement; a repeated idempotency_key returns the existing job."""
    if not specs:
        return []
    clock = now or datetime.now(timezone.utc)
    clock_iso = clock.isoformat()
    ids = new_ids(len(specs))
    rows = [{"id": str(job_id), "data": enqueued_data(spec, clock, now_iso=clock_iso),
             "tags": spec.tags} for job_id, spec in zip(ids, specs)]
    keyed = any(spec.idempotency_key is not None for spec in specs)
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(q("job_enqueue"), {"jobs": json.dumps(rows), "actor": actor, "now": now})
        if not keyed:  # nothing can conflict: every job is new (skip parsing RETURNING)
            return [Enqueued(job_id, True) for job_id in ids]
        inserted = {row[0] for row in cur.fetchall()}
        missing_keys = [spec.idempotency_key for spec, job_id in zip(specs, ids)
                        if job_id not in inserted]
        existing: dict[str, uuid.UUID] = {}
        if missing_keys:
            # ON CONFLICT waited for the other writer, so its job is visible now.
            cur.execute(q("job_ids_by_idempotency_key"), {"keys": missing_keys})
            existing = {key: job_id for job_id, key in cur.fetchall()}
    return [Enqueued(job_id, True) if job_id in inserted
            else Enqueued(existing[spec.idempotency_key], False)
            for spec, job_id in zip(specs, ids)]
