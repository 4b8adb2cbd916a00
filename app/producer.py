"""Enqueue from the application's own code, in the application's own transaction.

`qforge.enqueue(conn, "send_email", {...})` on the psycopg connection the
application already writes its business rows with: the job exists if and only if
that transaction commits. Given an AsyncConnection, the same call returns an
awaitable. The statements are the commands' own plans (qforge.commands.plan),
run without a transaction of their own when the connection is idle and a
savepoint inside an open one.
"""

from __future__ import annotations

import uuid
from typing import Any, Awaitable

from psycopg import AsyncConnection

from qforge import tracing
from qforge.commands.enqueue import batch_attributes, enqueue_many_plan, enqueue_plan, span_attributes
from qforge.commands.plan import run, run_async
from qforge.commands.errors import Invalid
from qforge.commands.specs import JobSpec, WorkflowSpec, parse_batch, parse_spec
from qforge.workflows.submit import span_values, starts_children, submit_plan
from qforge.workflows.durable import CodeWorkflowSpec, start_plan, traced_start

ACTOR = "app"  # the events' actor: written by the application, not the API or a worker


def _job_spec(task: str, payload: dict[str, Any] | None, options: dict[str, Any]) -> JobSpec:
    return parse_spec(JobSpec, {"task": task, "payload": payload or {}, **options})


def enqueue(conn, task: str, payload: dict[str, Any] | None = None,
            **options: Any) -> uuid.UUID | Awaitable[uuid.UUID]:
    """Enqueue a job on the caller's connection and in its transaction; the job's id (with an
    idempotency_key seen before, the existing job's). Options as POST /jobs: queue, priority,
    max_retries, run_at, delay_seconds, timeout_seconds, tags, idempotency_key."""
    spec = _job_spec(task, payload, options)
    if isinstance(conn, AsyncConnection):
        return _enqueue_async(conn, spec)
    with tracing.enqueue_span(**span_attributes([spec])) as traced:
        [outcome] = run(conn, enqueue_plan([spec], actor=ACTOR, trace=traced.carrier), own_transaction=False)
        traced.set(job_id=outcome.id)
    return outcome.id


def enqueue_many(conn, task: str, payloads: list[dict[str, Any] | None],
                 **options: Any) -> list[uuid.UUID] | Awaitable[list[uuid.UUID]]:
    """Enqueue one job of `task` per payload (None: no payload), all with the same options (those of
    enqueue() but idempotency_key), in the caller's transaction; their ids, in order. The batch is
    validated once, not job by job, and written by one statement per 250 jobs."""
    shared, payloads = parse_batch(task, payloads, options)
    if isinstance(conn, AsyncConnection):
        return _enqueue_many_async(conn, shared, payloads)
    with tracing.enqueue_span(**batch_attributes(shared, payloads)) as traced:
        return run(conn, enqueue_many_plan(shared, payloads, actor=ACTOR, trace=traced.carrier),
                   own_transaction=False)


async def enqueue_many_async(conn: AsyncConnection, task: str, payloads: list[dict[str, Any] | None],
                             **options: Any) -> list[uuid.UUID]:
    """enqueue_many() for an AsyncConnection, spelled out."""
    return await _enqueue_many_async(conn, *parse_batch(task, payloads, options))


async def _enqueue_many_async(conn: AsyncConnection, shared: JobSpec, payloads: list) -> list[uuid.UUID]:
    with tracing.enqueue_span(**batch_attributes(shared, payloads)) as traced:
        return await run_async(conn, enqueue_many_plan(shared, payloads, actor=ACTOR, trace=traced.carrier),
                               own_transaction=False)


def submit(conn, workflow: WorkflowSpec | dict[str, Any]) -> uuid.UUID | Awaitable[uuid.UUID]:
    """Submit a workflow (the body of POST /workflows) in the caller's transaction; its id."""
    spec = _in_transaction_spec(workflow)
    if isinstance(conn, AsyncConnection):
        return _submit_async(conn, spec)
    with tracing.span("qforge.submit", **span_values(spec)) as traced:
        workflow_id, _ = run(conn, submit_plan(spec, actor=ACTOR, trace=traced.carrier), own_transaction=False)
        traced.set(workflow_id=workflow_id)
    return workflow_id


def start(conn, name: str, input: Any = None, **options: Any) -> uuid.UUID | Awaitable[uuid.UUID]:
    """Start the code workflow `name` (@qforge.workflow) in the caller's transaction; its id. Options
    as POST /workflows with code: tags, idempotency_key, deadline_seconds, queue."""
    spec = parse_spec(CodeWorkflowSpec, {"code": name, "input": input, **options})
    if isinstance(conn, AsyncConnection):
        return _start_async(conn, spec)
    with traced_start(spec) as traced:
        workflow_id, _ = run(conn, start_plan(spec, actor=ACTOR, trace=traced.carrier), own_transaction=False)
    return workflow_id


async def start_async(conn: AsyncConnection, name: str, input: Any = None, **options: Any) -> uuid.UUID:
    return await _start_async(conn, parse_spec(CodeWorkflowSpec, {"code": name, "input": input, **options}))


async def _start_async(conn: AsyncConnection, spec: CodeWorkflowSpec) -> uuid.UUID:
    with traced_start(spec) as traced:
        workflow_id, _ = await run_async(conn, start_plan(spec, actor=ACTOR, trace=traced.carrier),
                                         own_transaction=False)
    return workflow_id


async def enqueue_async(conn: AsyncConnection, task: str, payload: dict[str, Any] | None = None,
                        **options: Any) -> uuid.UUID:
    """enqueue() for an AsyncConnection, spelled out."""
    return await _enqueue_async(conn, _job_spec(task, payload, options))


async def submit_async(conn: AsyncConnection, workflow: WorkflowSpec | dict[str, Any]) -> uuid.UUID:
    return await _submit_async(conn, _in_transaction_spec(workflow))


def _in_transaction_spec(workflow: WorkflowSpec | dict[str, Any]) -> WorkflowSpec:
    """A workflow that can be stored by statements alone: one whose first steps start
    sub-workflows needs the commands' advance as well (POST /workflows does it)."""
    spec = parse_spec(WorkflowSpec, workflow)
    if starts_children(spec):
        raise Invalid("a workflow whose first steps start sub-workflows cannot be submitted in the caller's"
                      " transaction: submit it through the API (POST /workflows) or the client",
                      [{"field": "steps", "message": "a root step of type workflow"}])
    return spec


async def _enqueue_async(conn: AsyncConnection, spec: JobSpec) -> uuid.UUID:
    with tracing.enqueue_span(**span_attributes([spec])) as traced:
        [outcome] = await run_async(conn, enqueue_plan([spec], actor=ACTOR, trace=traced.carrier),
                                    own_transaction=False)
        traced.set(job_id=outcome.id)
    return outcome.id


async def _submit_async(conn: AsyncConnection, spec: WorkflowSpec) -> uuid.UUID:
    with tracing.span("qforge.submit", **span_values(spec)) as traced:
        workflow_id, _ = await run_async(conn, submit_plan(spec, actor=ACTOR, trace=traced.carrier),
                                         own_transaction=False)
        traced.set(workflow_id=workflow_id)
    return workflow_id
