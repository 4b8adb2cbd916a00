"""The state machine: the one table of legal transitions for jobs (and steps) and workflows.

Every command guards with it; the database gets it as a generated definition
(`state_machine_definition`, applied by `qforge migrate`), which the fold
(`state_target`, `state_refuse`) and the guards of the command statements
(`state_allows`) read.
No other code lists statuses: use the names and sets below.
"""

from __future__ import annotations

import json
from typing import Iterable

from qforge.events import types as ev

NEW = ""  # the status of a stream that does not exist yet

# Job (and workflow step) statuses.
BLOCKED = "blocked"  # dependencies not done
PENDING = "pending"  # claimable at run_at
WAITING = "waiting"  # a trigger or a timer
RUNNING = "running"
SUCCEEDED = "succeeded"
DEAD = "dead"  # retries exhausted
CANCELLED = "cancelled"
SKIPPED = "skipped"
# Workflow statuses (running, succeeded and cancelled are shared with jobs).
FAILED = "failed"

# (status, event type) -> new status. A set means the event chooses one of
# them with its data["status"] (e.g. a workflow step is created blocked).
JOB_TRANSITIONS: dict[tuple[str, str], str | frozenset[str]] = {
    # created: a plain job is pending, a step with dependencies (or a failure
    # handler) is blocked, a root wait step is waiting at once
    (NEW, ev.Enqueued.type): frozenset({PENDING, BLOCKED, WAITING}),
    # dependencies done and condition true: a task step becomes claimable, a
    # trigger/sleep step starts waiting
    (BLOCKED, ev.StepUnblocked.type): frozenset({PENDING, WAITING}),
    # a condition false, or an upstream step that can no longer succeed
    (BLOCKED, ev.Skipped.type): SKIPPED,
    # a worker takes it (every claim bumps attempts: the fencing token)
    (PENDING, ev.Claimed.type): RUNNING,
    (RUNNING, ev.Heartbeat.type): RUNNING,
    (RUNNING, ev.Succeeded.type): SUCCEEDED,
    # a failed attempt is always followed, in the same transaction, by
    # Retried (back to pending at run_at) or DeadLettered
    (RUNNING, ev.Failed.type): RUNNING,
    (RUNNING, ev.Retried.type): PENDING,
    (RUNNING, ev.DeadLettered.type): DEAD,
    # a stopping worker hands the job back without using up an attempt
    (RUNNING, ev.Released.type): PENDING,
    # sleep timer fired / trigger pressed / trigger wait timed out
    (WAITING, ev.Succeeded.type): SUCCEEDED,
    (WAITING, ev.Triggered.type): SUCCEEDED,
    (WAITING, ev.Failed.type): WAITING,
    (WAITING, ev.DeadLettered.type): DEAD,
    # cancel: anything not finished; a running job's worker learns it at its
    # next heartbeat (rejected) and stops the task
    (PENDING, ev.Cancelled.type): CANCELLED,
    (BLOCKED, ev.Cancelled.type): CANCELLED,
    (WAITING, ev.Cancelled.type): CANCELLED,
    (RUNNING, ev.Cancelled.type): CANCELLED,
    # manual retry: a dead or cancelled job runs again
    (DEAD, ev.Retried.type): PENDING,
    (CANCELLED, ev.Retried.type): PENDING,
    # a resumed workflow runs its dead, cancelled and skipped steps again:
    # blocked until the DAG rules decide, or at once pending / waiting
    (DEAD, ev.StepReopened.type): frozenset({BLOCKED, PENDING, WAITING}),
    (CANCELLED, ev.StepReopened.type): frozenset({BLOCKED, PENDING, WAITING}),
    (SKIPPED, ev.StepReopened.type): frozenset({BLOCKED, PENDING, WAITING}),
    # a workflow's deadline passed: what has not started is skipped (running
    # steps are cancelled, as a cancel does)
    (PENDING, ev.Skipped.type): SKIPPED,
    (WAITING, ev.Skipped.type): SKIPPED,
}

WORKFLOW_TRANSITIONS: dict[tuple[str, str], str | frozenset[str]] = {
    (NEW, ev.WorkflowSubmitted.type): RUNNING,
    (RUNNING, ev.WorkflowSucceeded.type): SUCCEEDED,
    (RUNNING, ev.WorkflowFailed.type): FAILED,
    (RUNNING, ev.WorkflowCancelled.type): CANCELLED,
    # resume: from the failed step (or an operator's retry of a dead step)
    (FAILED, ev.WorkflowResumed.type): RUNNING,
    (CANCELLED, ev.WorkflowResumed.type): RUNNING,
}

# API tokens: created (again after a revocation, with a new secret), revoked.
ACTIVE = "active"
REVOKED = "revoked"
TOKEN_TRANSITIONS: dict[tuple[str, str], str | frozenset[str]] = {
    (NEW, ev.TokenCreated.type): ACTIVE,
    (ACTIVE, ev.TokenRevoked.type): REVOKED,
    (REVOKED, ev.TokenCreated.type): ACTIVE,
}

MACHINES = {"job": JOB_TRANSITIONS, "workflow": WORKFLOW_TRANSITIONS, "token": TOKEN_TRANSITIONS}

# Statuses a step (job) never leaves on its own: the workflow evaluator waits
# for these. (dead and cancelled can still be retried by hand.)
JOB_FINISHED = frozenset({SUCCEEDED, DEAD, CANCELLED, SKIPPED})
# Statuses from which a job will still run without anyone's help.
JOB_ACTIVE = frozenset({PENDING, RUNNING, BLOCKED, WAITING})
# The job events that can make a job claimable (lead to pending): where its
# enqueue-to-start latency is measured from (job_ready_at in SQL).
JOB_READY_EVENTS = frozenset(
    event for (_, event), to in JOB_TRANSITIONS.items()
    if PENDING in (to if isinstance(to, frozenset) else {to}))
WORKFLOW_FINISHED = frozenset({SUCCEEDED, FAILED, CANCELLED})
# Step statuses that do not fail their workflow (a dead step may still be
# forgiven by a handler that succeeded: see qforge.workflows.dag).
STEP_FINE = frozenset({SUCCEEDED, SKIPPED})


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


def targets_document() -> dict[str, dict[str, str]]:
    """{machine: {"status/Event/wanted": new status}}: one probe answers a transition.

    "wanted" is the status an event names (data.status) or empty: an event that
    leaves the choice to its data is found only with it, one with a single
    target with or without it."""
    document: dict[str, dict[str, str]] = {}
    for machine, table in MACHINES.items():
        flat = document.setdefault(machine, {})
        for (source, event_type), target in table.items():
            for to in [target] if isinstance(target, str) else sorted(target):
                flat[f"{source}/{event_type}/{to}"] = to
            if isinstance(target, str):
                flat[f"{source}/{event_type}/"] = target
    return document


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def state_machine_definition() -> str:
    """This table as a repeatable schema definition (migrate applies it when it changes).

    Two forms: the state_transitions table to query, and state_machine(), an
    IMMUTABLE function returning the table as one jsonb constant, which
    state_target()/state_allows() read without a query per event. Deterministic
    text, so its checksum changes exactly when the table does.
    """
    document = json.dumps(as_document(), sort_keys=True)
    targets = json.dumps(targets_document(), sort_keys=True)
    values = ",\n".join(f"    ({', '.join(_literal(v) for v in row)})" for row in sorted(rows()))
    return (
        "-- Generated from qforge.events.states: the state machine.\n"
        "CREATE OR REPLACE FUNCTION state_machine() RETURNS jsonb LANGUAGE sql IMMUTABLE PARALLEL SAFE\n"
        f"AS $$ SELECT {_literal(document)}::jsonb $$;\n"
        "CREATE OR REPLACE FUNCTION state_targets() RETURNS jsonb LANGUAGE sql IMMUTABLE PARALLEL SAFE\n"
        f"AS $$ SELECT {_literal(targets)}::jsonb $$;\n"
        # Generated by earlier versions and never read: gone from upgraded databases too.
        "DROP FUNCTION IF EXISTS state_effects(), state_allowed(), state_codes();\n"
        "DELETE FROM state_transitions;\n"
        "INSERT INTO state_transitions (machine, from_status, event_type, to_status) VALUES\n"
        f"{values};\n"
    )
