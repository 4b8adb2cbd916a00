"""Queue settings: pause, resume and the rate limit (a token bucket the claim spends), as events."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, model_validator

from qforge.commands.errors import Invalid
from qforge.events import store
from qforge.events import types as ev
from qforge.events.types import NewEvent
from qforge.sql import q

# Queue streams are named by the queue: the same name is the same stream on every database.
QUEUE_NAMESPACE = uuid.UUID("6d2f7c1e-2f0b-4c55-9a57-3e1c6f0a9b16")


def queue_stream_id(queue: str) -> uuid.UUID:
    return uuid.uuid5(QUEUE_NAMESPACE, queue)


class QueueSettingsSpec(BaseModel):
    """PUT /queues/{name}: `{"rate_per_second"?: float | null, "burst"?: int, "paused"?: bool}`;
    a field left out keeps its current value."""

    model_config = ConfigDict(extra="forbid")

    # strict: true is not 1 (JSON's booleans are no numbers)
    rate_per_second: StrictFloat | None = Field(default=None, gt=0, le=1_000_000,
                                          description="claims per second over all workers; null: no limit")
    burst: StrictInt | None = Field(default=None, ge=1, le=1_000_000,
                              description="claims allowed at once after a quiet spell "
                                          "(default: one second's worth, at least 1)")
    paused: StrictBool | None = None  # strict: 0 or "yes" is not a boolean

    @model_validator(mode="after")
    def _burst_needs_rate(self) -> "QueueSettingsSpec":
        if self.burst is not None and "rate_per_second" in self.model_fields_set and self.rate_per_second is None:
            raise ValueError("burst needs a rate_per_second")
        return self


@dataclass(frozen=True)
class QueueSettings:
    queue: str
    paused: bool
    rate_per_second: float | None
    burst: int | None


def configure_queue(conn, queue: str, spec: QueueSettingsSpec, *, actor: str = "api",
                    now: datetime | None = None) -> QueueSettings:
    """Apply the fields given; one event per change (nothing when nothing changes)."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(q("queue_settings_lock"), {"queue": queue}).fetchone()["row"] or {}
        version = row.get("version", 0)
        paused = bool(row.get("paused", False))
        rate, burst = row.get("rate_per_second"), row.get("burst")
        events: list[ev.EventData] = []
        given = spec.model_fields_set
        if "rate_per_second" in given or "burst" in given:
            new_rate = spec.rate_per_second if "rate_per_second" in given else rate
            new_burst = spec.burst if spec.burst is not None else (
                burst if "rate_per_second" not in given and burst is not None else None)
            if new_rate is None and spec.burst is not None:
                raise Invalid(f"queue {queue}: burst needs a rate_per_second (the queue has no rate limit)",
                              [{"field": "burst", "message": "needs a rate_per_second"}])
            if new_rate is not None and new_burst is None:
                new_burst = max(1, math.ceil(new_rate))
            if new_rate is None:
                new_burst = None
            if (new_rate, new_burst) != (rate, burst) or version == 0:
                events.append(ev.QueueConfigured(queue=queue, rate_per_second=new_rate, burst=new_burst))
                rate, burst = new_rate, new_burst
                cur.execute(q("queue_bucket_drop"), {"queue": queue})
                if rate is not None:
                    cur.execute(q("queue_bucket_set"), {"queue": queue, "burst": burst, "now": now})
        if spec.paused is not None and (spec.paused != paused or (version == 0 and not events)):
            events.append(ev.QueuePaused(queue=queue) if spec.paused else ev.QueueResumed(queue=queue))
            paused = spec.paused
        stream = queue_stream_id(queue)
        store.append(conn, [NewEvent(stream_id=stream, version=version + n, data=data)
                           for n, data in enumerate(events, start=1)], actor=actor, now=now)
    if events and not paused:
        conn.execute(q("queue_wake"), {"queue": queue})  # resumed or rate changed: wake idle workers
    return QueueSettings(queue, paused, rate, burst)


def list_queue_settings(conn) -> dict[str, dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return {row["queue"]: row for row in cur.execute(q("queue_settings_list")).fetchall()}
