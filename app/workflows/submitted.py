"""The first event of every workflow, graph or code: WorkflowSubmitted, once per idempotency key."""

from __future__ import annotations

import json
import uuid
from datetime import datetime

from qforge.commands.plan import Plan, Statement
from qforge.events import types as ev
from qforge.sql import q


def store_submitted(workflow_id: uuid.UUID, submitted: ev.WorkflowSubmitted, tags: dict[str, str], *,
                    actor: str, now: datetime | None) -> Plan[uuid.UUID | None]:
    """Append WorkflowSubmitted; None, or the id of the workflow that has its idempotency key."""
    [stored] = yield [Statement(q("workflow_submit"), {
        "id": workflow_id, "data": json.dumps(submitted.model_dump(mode="json", exclude_none=True)),
        "tags": json.dumps(tags), "now": now, "actor": actor}, fetch=True)]
    if stored:
        return None
    [existing] = yield [Statement(q("workflow_by_idempotency_key"), {"key": submitted.idempotency_key},
                                  fetch=True)]
    return existing[0][0]
