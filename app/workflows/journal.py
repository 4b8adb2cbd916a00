"""A code workflow's journal as its job rows hold it: the activations' recorded operations, the steps' states.

Each run of the function is a job of the workflow (an *activation*, step type
`code`, step `@1`, `@2`, ...); its result is what that run did: the operations
it issued beyond the journal (`ops`), what it then waited on (`waiting_on`), or
how it ended (`outcome`). The journal is the ops of the succeeded activations,
in order. Pure functions over rows: the API's view, the worker and the advance
all read it the same way.
"""

from __future__ import annotations

from typing import Any

from qforge.events.states import SUCCEEDED
from qforge.workflows.replay import STEP_OPS, StepRecord

TASK = "qforge.workflow"  # the activation's task: the worker runs the function (qforge.workflows.activation)
ACTIVATION = "code"  # the activation's step type


def is_activation(row: dict[str, Any]) -> bool:
    return row.get("step_type") == ACTIVATION


def activations(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The workflow's activation rows, oldest first."""
    return sorted((r for r in rows if is_activation(r)), key=lambda r: (r.get("payload") or {}).get("n", 0))


def decisions(row: dict[str, Any]) -> dict[str, Any]:
    """What a succeeded activation recorded ({} for one that did not succeed)."""
    result = row.get("result") if row.get("status") == SUCCEEDED else None
    return result if isinstance(result, dict) else {}


def journal(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operations of the runs that went on (a run that ended the workflow made no steps: a
    resumed workflow's next run issues them again, as new)."""
    return [op for row in activations(rows) if not decisions(row).get("outcome")
            for op in decisions(row).get("ops", [])]


def step_records(rows: list[dict[str, Any]]) -> dict[str, StepRecord]:
    return {row["step"]: StepRecord(status=row["status"], result=row.get("result"), error=row.get("last_error"),
                                    attempts=row.get("attempts") or 0)
            for row in rows if row.get("step") and not is_activation(row)}


def step_order(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Each step's place in the order the function scheduled them (the dashboard draws it so)."""
    names = [op["step"] for op in journal(rows) if op.get("op") in STEP_OPS]
    return {name: index for index, name in enumerate(names)}


def run_trace(rows: list[dict[str, Any]]) -> dict[str, str] | None:
    """The run's stored trace context (its first activation's), or None when untraced."""
    return next((row["trace"] for row in rows if row.get("trace") and is_activation(row)), None)
