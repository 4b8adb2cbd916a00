"""Submitting a workflow: check its graph and store it and its steps, as a plan; no step is advanced here.

`submit_plan` is the statements (qforge.commands.plan), which qforge.submit also runs in
the caller's transaction; `submitting` runs them in a transaction of their own inside the
qforge.submit span. Starting the root sub-workflows a submit may have is the engine's
(qforge.workflows.engine.submit), in that same transaction.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

from psycopg.rows import tuple_row

from qforge.commands.enqueue import job_row
from qforge.commands.errors import Invalid, NotFound
from qforge.commands.plan import Plan, Statement, run
from qforge.commands.specs import StepSpec, WorkflowSpec
from qforge.events import types as ev
from qforge.events.ids import new_id
from qforge.events.states import WAITING
from qforge import tracing
from qforge.sql import q
from qforge.workflows import dag
from qforge.workflows.rows import wait_until
from qforge.workflows.submitted import store_submitted


def _step_data(step: StepSpec, handlers: dict[str, list[str]], now: datetime,
               trace: dict[str, str] | None = None) -> ev.Enqueued:
    definition = step.definition()
    status = dag.initial_status(definition, handlers)
    run_at = wait_until(step.type, step.seconds, step.timeout_seconds, now) if status == WAITING else None
    return ev.Enqueued(task=step.task or step.type, queue=step.queue, priority=step.priority,
                       max_retries=step.max_retries, run_at=run_at, payload=step.payload,
                       status=status, timeout_seconds=step.timeout_seconds, step=step.step,
                       step_type=step.type, depends_on=list(definition.dependencies()),
                       when=definition.when, on_failure=step.on_failure, seconds=step.seconds,
                       concurrency_key=step.concurrency_key, concurrency_limit=step.concurrency_limit,
                       fairness_key=step.fairness_key,
                       backoff_base_seconds=step.backoff_base_seconds,
                       backoff_cap_seconds=step.backoff_cap_seconds, trace=trace)


@contextlib.contextmanager
def submitting(conn, spec: WorkflowSpec, *, actor: str = "api", now: datetime | None = None,
               external_id: str | None = None, definition: dict[str, Any] | None = None,
               parent: dict[str, Any] | None = None,
               trace_parent: dict[str, str] | None = None) -> Iterator[tuple[uuid.UUID, bool]]:
    """Check the graph (every problem at once: Invalid), then store the workflow and its steps, in a
    transaction and a qforge.submit span that stay open while the caller's block runs; yields
    (id, created).

    `external_id` is the id another system knows the workflow by (the pod
    orchestrator's workflowId); `definition` ({"name", "version"}) the stored
    definition it runs; `parent` ({"workflow_id", "step", "job_id", "depth"}) the
    step of another workflow that started it (qforge.workflows.subflows), and `trace_parent` the
    stored trace context its qforge.submit span is a child of (the parent step's; else the
    caller's current span)."""
    with conn.transaction(), tracing.span("qforge.submit", parent=trace_parent, **span_values(spec, definition)
                                          ) as traced:
        workflow_id, created = run(conn, submit_plan(spec, actor=actor, now=now, external_id=external_id,
                                                     definition=definition, parent=parent, trace=traced.carrier))
        traced.set(workflow_id=workflow_id)
        yield workflow_id, created


def span_values(spec: WorkflowSpec, definition: dict[str, Any] | None = None) -> dict[str, Any]:
    """The qforge.submit span's attributes."""
    return {"workflow": spec.name, "steps": len(spec.steps),
            "definition": definition["name"] if definition else None,
            "definition_version": definition["version"] if definition else None}


def starts_children(spec: WorkflowSpec) -> bool:
    """Does the workflow start steps by the rules at once (sub-workflows), beyond storing them?"""
    return any(step.type in dag.STARTED_BY_THE_RULES for step in spec.steps)


def submit_plan(spec: WorkflowSpec, *, actor: str = "api", now: datetime | None = None,
                external_id: str | None = None, definition: dict[str, Any] | None = None,
                parent: dict[str, Any] | None = None,
                trace: dict[str, str] | None = None) -> Plan[tuple[uuid.UUID, bool]]:
    """submit()'s statements as a plan (qforge.commands.plan), for qforge.submit in the caller's
    transaction too; engine.submit then starts root sub-workflows (starts_children). `trace`: the
    submit span's context, stored in every step (their runs are its children)."""
    problems = spec.problems()
    wanted = sorted({s.definition_name for s in spec.steps if s.type == "workflow" and s.definition_name})
    if wanted:  # workflow steps naming stored definitions that do not exist
        [known_rows] = yield [Statement(q("definitions_known"), {"names": wanted}, fetch=True)]
        known = {row[0] for row in known_rows}
        problems += [f"step '{s.step}': unknown definition '{s.definition_name}'" for s in spec.steps
                     if s.type == "workflow" and s.definition_name and s.definition_name not in known]
    if parent and parent.get("depth", 1) > MAX_NESTING:
        problems.append(f"sub-workflows nest more than {MAX_NESTING} deep (a definition that starts itself?)")
    if problems:
        raise Invalid("invalid workflow: " + "; ".join(problems), problems)
    clock = now or datetime.now(timezone.utc)
    workflow_id = new_id()
    handlers = dag.handlers_of(s.definition() for s in spec.steps)
    submitted = ev.WorkflowSubmitted(
        name=spec.name, idempotency_key=spec.idempotency_key, external_id=external_id,
        steps=[s.model_dump(mode="json", by_alias=True, exclude_none=True) for s in spec.steps],
        result=spec.result.model_dump(exclude_none=True) if spec.result else None,
        deadline_seconds=spec.deadline_seconds, definition=definition, parent=parent,
        deadline_at=(clock + timedelta(seconds=spec.deadline_seconds)
                     if spec.deadline_seconds is not None else None))
    existing = yield from store_submitted(workflow_id, submitted, spec.tags, actor=actor, now=now)
    if existing is not None:
        return existing, False
    rows = [job_row(new_id(), _step_data(step, handlers, clock, trace), spec.tags, workflow_id)
            for step in spec.steps]
    yield [Statement(q("job_enqueue"), {"jobs": json.dumps(rows), "actor": actor, "now": now})]
    return workflow_id, True


MAX_NESTING = 10  # sub-workflows within sub-workflows


def find(conn, *, external_id: str) -> uuid.UUID:
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(q("workflow_by_external_id"), {"external_id": external_id})
        row = cur.fetchone()
    if row is None:
        raise NotFound(f"workflow {external_id} not found")
    return row[0]
