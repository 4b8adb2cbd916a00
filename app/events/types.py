"""Event types: facts in the past tense, with a schema version, and the envelope."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

# Job (and workflow step) events.
ENQUEUED = "Enqueued"
CLAIMED = "Claimed"
HEARTBEAT = "Heartbeat"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
RETRIED = "Retried"
DEAD_LETTERED = "DeadLettered"
CANCELLED = "Cancelled"
SKIPPED = "Skipped"
TRIGGERED = "Triggered"
RELEASED = "Released"
STEP_UNBLOCKED = "StepUnblocked"
# Workflow events.
WORKFLOW_SUBMITTED = "WorkflowSubmitted"
WORKFLOW_SUCCEEDED = "WorkflowSucceeded"
WORKFLOW_FAILED = "WorkflowFailed"
WORKFLOW_CANCELLED = "WorkflowCancelled"

JOB_EVENT_TYPES = frozenset({
    ENQUEUED, CLAIMED, HEARTBEAT, SUCCEEDED, FAILED, RETRIED, DEAD_LETTERED, CANCELLED,
    SKIPPED, TRIGGERED, RELEASED, STEP_UNBLOCKED,
})
WORKFLOW_EVENT_TYPES = frozenset({
    WORKFLOW_SUBMITTED, WORKFLOW_SUCCEEDED, WORKFLOW_FAILED, WORKFLOW_CANCELLED,
})
EVENT_TYPES = JOB_EVENT_TYPES | WORKFLOW_EVENT_TYPES

# The current schema version of each type; older versions are upcast on read
# by event_upcast() in migrations/0002 (Failed v1 had {"message"}; v2 has
# {"reason", "error"}).
SCHEMA_VERSIONS: dict[str, int] = {FAILED: 2}


def schema_version(event_type: str) -> int:
    return SCHEMA_VERSIONS.get(event_type, 1)


class NewEvent(BaseModel):
    """An event about to be appended; the database assigns position and xid."""

    model_config = ConfigDict(frozen=True)

    stream_type: Literal["job", "workflow"]
    stream_id: UUID
    version: int
    type: str
    data: dict[str, Any] = Field(default_factory=dict)
    tags: dict[str, str] = Field(default_factory=dict)
    workflow_id: UUID | None = None
    actor: str | None = None

    def row(self) -> dict[str, Any]:
        out = self.model_dump(mode="json")
        out["schema_version"] = schema_version(self.type)
        return out


class Event(BaseModel):
    """A stored event, as read back (already upcast to the current schema)."""

    model_config = ConfigDict(frozen=True)

    position: int
    stream_type: str
    stream_id: UUID
    version: int
    type: str
    schema_version: int
    data: dict[str, Any]
    tags: dict[str, str]
    workflow_id: UUID | None = None
    occurred_at: datetime
    actor: str
    xid: int = Field(exclude=True)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Event":
        return cls(**{**row, "xid": int(row["xid"])})
