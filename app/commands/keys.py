"""Per-key limits set centrally (PUT /keys/{key}): concurrency, fairness weight and rate, as events of the key's stream."""

from __future__ import annotations

import math
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from qforge.commands.errors import Invalid
from qforge.events import store
from qforge.events import types as ev
from qforge.events.types import NewEvent
from qforge.sql import q

# Key streams are named by the key: the same name is the same stream on every database.
KEY_NAMESPACE = uuid.UUID("3b8e2a4c-9d71-4f0e-b5a2-7c4d1e6f8a93")
KEY_MAX_LENGTH = 200  # as a job's concurrency_key / fairness_key (commands/specs.py)
MAX_WEIGHT = 1000


def key_stream_id(key: str) -> uuid.UUID:
    return uuid.uuid5(KEY_NAMESPACE, key)


class KeySettingsSpec(BaseModel):
    """PUT /keys/{key}: `{"concurrency_limit"?: int | null, "weight"?: int, "rate_per_second"?: float | null,
    "burst"?: int}`; a field left out keeps its current value, null clears it."""

    model_config = ConfigDict(extra="forbid")

    concurrency_limit: StrictInt | None = Field(
        default=None, ge=1, le=1_000_000,
        description="at most this many jobs with this concurrency_key run at once, whatever the jobs say;"
                    " null: each job's own concurrency_limit")
    weight: StrictInt = Field(default=1, ge=1, le=MAX_WEIGHT,
                              description="turns this fairness_key takes per rotation (default 1)")
    rate_per_second: StrictFloat | None = Field(default=None, gt=0, le=1_000_000,  # strict: true is no rate
                                                description="claims per second of this key's jobs over all"
                                                            " queues and workers; null: no limit")
    burst: StrictInt | None = Field(default=None, ge=1, le=1_000_000,
                                    description="claims allowed at once after a quiet spell"
                                                " (default: one second's worth, at least 1)")


@dataclass(frozen=True)
class KeySettings:
    key: str
    concurrency_limit: int | None
    weight: int
    rate_per_second: float | None
    burst: int | None


def configure_key(conn, key: str, spec: KeySettingsSpec, *, actor: str = "api",
                  now: datetime | None = None) -> KeySettings:
    """Apply the fields given: one KeyConfigured with the key's whole settings when they change (or
    when the key was never configured), nothing otherwise."""
    if not 1 <= len(key) <= KEY_MAX_LENGTH:
        raise Invalid(f"a key is 1 to {KEY_MAX_LENGTH} characters", [{"field": "key", "message": "length"}])
    given = spec.model_fields_set
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(q("key_settings_lock"), {"key": key}).fetchone()["row"] or {}
        version = row.get("version", 0)
        old = KeySettings(key, row.get("concurrency_limit"), row.get("weight", 1),
                          row.get("rate_per_second"), row.get("burst"))
        rate = spec.rate_per_second if "rate_per_second" in given else old.rate_per_second
        if spec.burst is not None and rate is None:
            raise Invalid(f"key {key}: burst needs a rate_per_second (the key has no rate limit)",
                          [{"field": "burst", "message": "needs a rate_per_second"}])
        if spec.burst is not None:
            burst = spec.burst
        elif "rate_per_second" in given or rate is None:
            burst = None if rate is None else max(1, math.ceil(rate))  # a new rate: one second's worth
        else:
            burst = old.burst
        new = KeySettings(key,
                          spec.concurrency_limit if "concurrency_limit" in given else old.concurrency_limit,
                          spec.weight if "weight" in given else old.weight, rate, burst)
        if new != old or version == 0:
            store.append(conn, [NewEvent(stream_id=key_stream_id(key), version=version + 1,
                                         data=ev.KeyConfigured(**asdict(new)))], actor=actor, now=now)
            if (new.rate_per_second, new.burst) != (old.rate_per_second, old.burst):
                cur.execute(q("key_bucket_drop"), {"key": key})
                if new.rate_per_second is not None:
                    cur.execute(q("key_bucket_set"), {"key": key, "burst": new.burst, "now": now})
    return new


def list_keys(conn, *, after: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Keys in name order: configured ones and those jobs used, with their settings and running counts."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(q("key_list"), {"after": after, "limit": limit, "key": None}).fetchall()
    return [_view(row) for row in rows]


def get_key(conn, key: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(q("key_list"), {"after": None, "limit": 1, "key": key}).fetchone()
    return _view(row) if row else None


def _view(row: dict[str, Any]) -> dict[str, Any]:
    running = None
    if row["concurrency_running"] is not None or row["fairness_running"]:
        running = int(row["concurrency_running"] or 0) + int(row["fairness_running"] or 0)
    return {"key": row["key"], "configured": row["configured"],
            "concurrency_limit": row["concurrency_limit"], "weight": row["weight"],
            "rate_per_second": row["rate_per_second"], "burst": row["burst"],
            "concurrency_limit_in_force": row["concurrency_limit_in_force"],
            "running": running if running is not None else 0,
            "fairness_claimed": int(row["fairness_claimed"] or 0), "updated_at": row["updated_at"]}
