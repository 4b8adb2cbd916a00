"""The state machine: the one table of legal transitions for jobs (and steps) and workflows.

Every command guards with it, the SQL fold (`state_next` in migrations/0002) reads
it from `state_transitions`, which `qforge migrate` fills from this module.
No other code lists statuses.
"""

from __future__ import annotations

import json
from typing import Iterable

from psycopg import sql

NEW = ""  # the status of a stream that does not exist yet

# (status, event type) -> new status. A set means the event chooses one of
# them with its data["status"] (e.g. a workflow step is created blocked).
JOB_TRANSITIONS: dict[tuple[str, str], str | frozenset[str]] = {
    # created: a plain job is pending, a step with dependencies (or a failure
    # handler) is blocked, a root wait step is waiting at once
    (NEW, "Enqueued"): frozenset({"pending", "blocked", "waiting"}),
    # dependencies done and condition true: a task step becomes claimable, a
    # trigger/sleep step starts waiting
    ("blocked", "StepUnblocked"): frozenset({"pending", "waiting"}),
    # a condition false, or an upstream step that can no longer succeed
    ("blocked", "Skipped"): "skipped",
    # a worker takes it (every claim bumps attempts: the fencing token)
    ("pending", "Claimed"): "running",
    ("running", "Heartbeat"): "running",
    ("running", "Succeeded"): "succeeded",
    # a failed attempt is always followed, in the same transaction, by
    # Retried (back to pending at run_at) or DeadLettered
    ("running", "Failed"): "running",
    ("running", "Retried"): "pending",
    ("running", "DeadLettered"): "dead",
    # a stopping worker hands the job back without using up an attempt
    ("running", "Released"): "pending",
    # sleep timer fired / trigger pressed / trigger wait timed out
    ("waiting", "Succeeded"): "succeeded",
    ("waiting", "Triggered"): "succeeded",
    ("waiting", "Failed"): "waiting",
    ("waiting", "DeadLettered"): "dead",
    # cancel: anything not finished; a running job's worker learns it at its
    # next heartbeat (rejected) and stops the task
    ("pending", "Cancelled"): "cancelled",
    ("blocked", "Cancelled"): "cancelled",
    ("waiting", "Cancelled"): "cancelled",
    ("running", "Cancelled"): "cancelled",
    # manual retry: a dead or cancelled job runs again
    ("dead", "Retried"): "pending",
    ("cancelled", "Retried"): "pending",
}

WORKFLOW_TRANSITIONS: dict[tuple[str, str], str | frozenset[str]] = {
    (NEW, "WorkflowSubmitted"): "running",
    ("running", "WorkflowSucceeded"): "succeeded",
    ("running", "WorkflowFailed"): "failed",
    ("running", "WorkflowCancelled"): "cancelled",
}

MACHINES = {"job": JOB_TRANSITIONS, "workflow": WORKFLOW_TRANSITIONS}

# Statuses a step (job) never leaves on its own: the workflow evaluator waits
# for these. (dead and cancelled can still be retried by hand.)
JOB_FINISHED = frozenset({"succeeded", "dead", "cancelled", "skipped"})
# Statuses from which a job will still run without anyone's help.
JOB_ACTIVE = frozenset({"pending", "running", "blocked", "waiting"})
WORKFLOW_FINISHED = frozenset({"succeeded", "failed", "cancelled"})
# Step statuses that do not fail their workflow (a dead step may still be
# forgiven by a handler that succeeded: see app/commands/dag.py).
STEP_FINE = frozenset({"succeeded", "skipped"})


class IllegalTransition(Exception):
    """An event that the current status does not allow."""

    def __init__(self, machine: str, status: str, event_type: str):
        super().__init__(f"{machine} in status '{status or 'new'}' cannot take {event_type}")
        self.machine, self.status, self.event_type = machine, status, event_type


def allows(machine: str, status: str | None, event_type: str) -> bool:
    return (status or NEW, event_type) in MACHINES[machine]


def next_status(machine: str, status: str | None, event_type: str, wanted: str | None = None) -> str:
    target = MACHINES[machine].get((status or NEW, event_type))
    if target is None:
        raise IllegalTransition(machine, status or NEW, event_type)
    if isinstance(target, str):
        if wanted is not None and wanted != target:
            raise IllegalTransition(machine, status or NEW, event_type)
        return target
    if wanted not in target:
        raise IllegalTransition(machine, status or NEW, event_type)
    return wanted


def statuses(machine: str) -> frozenset[str]:
    found: set[str] = set()
    for (source, _), target in MACHINES[machine].items():
        if source:
            found.add(source)
        found.update([target] if isinstance(target, str) else target)
    return frozenset(found)


def rows() -> Iterable[tuple[str, str, str, str]]:
    for machine, table in MACHINES.items():
        for (source, event_type), target in table.items():
            for to in [target] if isinstance(target, str) else sorted(target):
                yield machine, source, event_type, to


def as_document() -> dict[str, dict[str, list[str]]]:
    """{machine: {"status/Event": [new statuses]}}: the form the database reads."""
    document: dict[str, dict[str, list[str]]] = {}
    for machine, source, event_type, to in rows():
        document.setdefault(machine, {}).setdefault(f"{source}/{event_type}", []).append(to)
    return document


def install_state_machine(conn) -> None:
    """Make the database's copy of the table equal to this one (run by migrate).

    Two forms: the state_transitions table to query, and state_machine(), an
    IMMUTABLE function returning the table as one jsonb constant, which
    state_next()/state_allows() read without a query per event.
    """
    body = sql.SQL("SELECT {}::jsonb").format(sql.Literal(json.dumps(as_document(), sort_keys=True)))
    with conn.cursor() as cur:
        cur.execute("DELETE FROM state_transitions")
        cur.executemany(
            "INSERT INTO state_transitions (machine, from_status, event_type, to_status)"
            " VALUES (%s, %s, %s, %s)",
            list(rows()),
        )
        cur.execute(sql.SQL(
            "CREATE OR REPLACE FUNCTION state_machine() RETURNS jsonb"
            " LANGUAGE sql IMMUTABLE PARALLEL SAFE AS {}").format(sql.Literal(body.as_string(conn))))
