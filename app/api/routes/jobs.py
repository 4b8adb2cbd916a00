"""/jobs: enqueue, read, list, history, cancel, retry."""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from fastapi import APIRouter, Query, Request, Response

from qforge.api.auth import Actor, Caller, needs
from qforge.api.common import (ERRORS, PROOF_DOC, as_of_view, bad_query, cursor_query, limit_query, missing,
                               proof_answer, proof_cursor, tag_query, tags_of)
from qforge.api.deps import Conn, PageBytes, ReadConn
from qforge.api.errors import ApiError
from qforge.api.models import BulkResult, EventHistory, JobList, JobView
from qforge.commands.bulk import BulkRequest, bulk, count_matching
from qforge.commands.enqueue import enqueue
from qforge.commands.specs import JobSpec
from qforge.commands.manage import cancel_job, retry_job
from qforge.events import store
from qforge.events.states import statuses
from qforge.projections import asof, serving
from qforge.projections import jobs as jobs_view

router = APIRouter(tags=["jobs"])

JobStatus = Literal[tuple(sorted(statuses("job")))]  # type: ignore[valid-type]


def _job(conn, job_id: UUID, request: Request) -> dict:
    """The job as GET /jobs/{id} shows it, with waiting_for_worker when it is pending."""
    job = jobs_view.get_job(conn, job_id)
    if job is None:
        raise missing(conn, "job", job_id)
    return {**job, "waiting_for_worker": serving.job_warning(
        conn, job, request.app.state.resources.settings.stale_seconds)}


@router.post("/jobs", status_code=201, response_model=JobView, **needs("operate"),
             responses={200: {"model": JobView, "description": "an existing job with the same "
                                                                "idempotency_key"}, **ERRORS})
def create_job(body: JobSpec, conn: Conn, response: Response, actor: Actor, request: Request) -> dict:
    """Enqueue a job; the same idempotency_key again returns the existing job (200)."""
    [outcome] = enqueue(conn, [body], actor=actor)
    if not outcome.created:
        response.status_code = 200
    return _job(conn, outcome.id, request)


@router.get("/jobs", response_model=JobList, responses=ERRORS)
def list_jobs(conn: ReadConn, max_bytes: PageBytes,
              status: Annotated[JobStatus | None, Query()] = None,
              queue: Annotated[str | None, Query(max_length=200)] = None,
              task: Annotated[str | None, Query(max_length=200)] = None,
              tag: tag_query = None, limit: limit_query = 50,
              cursor: cursor_query = None) -> dict:
    """Jobs, newest first, filtered by status, queue, task and tags (key:value, all must match); a
    page ends after `limit` jobs or about QFORGE_API_PAGE_BYTES of JSON."""
    with bad_query():
        items, next_cursor = jobs_view.list_jobs(conn, status=status, queue=queue, task=task,
                                                 tags=tags_of(tag), limit=limit, cursor=cursor,
                                                 max_bytes=max_bytes)
    return {"items": items, "next": next_cursor}


@router.get("/jobs/{job_id}", response_model=JobView, responses=ERRORS)
def get_job(job_id: UUID, conn: ReadConn, request: Request,
            as_of: Annotated[int | None, Query(ge=0, le=2**62, description=(
                "the job as it was right after this log position (event replay)"))] = None) -> dict:
    if as_of is not None:
        return as_of_view(asof.job_as_of, request, job_id, as_of, f"job {job_id}")
    return _job(conn, job_id, request)


@router.get("/jobs/{job_id}/events", response_model=None,
            responses={200: {"model": EventHistory}, **ERRORS})
def job_events(job_id: UUID, conn: ReadConn) -> dict:
    """The job's own events, oldest first: its audit trail."""
    events = store.read_stream(conn, job_id)
    if not events:
        raise missing(conn, "job", job_id)
    if events[0].stream_type != "job":
        raise ApiError(404, "not_found", f"job {job_id} not found")
    return {"events": [e.model_dump(mode="json") for e in events]}


@router.get("/jobs/{job_id}/proof", response_model=None, responses=ERRORS,
            description=f"The job's events with their hashes and Merkle paths, and the checkpoints up to the"
                        f" newest.{PROOF_DOC}")
def job_proof(job_id: UUID, conn: Conn, request: Request, who: Caller, cursor: proof_cursor = None) -> dict:
    return proof_answer(conn, request, who, "job", job_id, cursor)


def _bulk(action, body: BulkRequest, conn, actor: str) -> dict:
    if body.dry_run:
        return {"count": count_matching(conn, action, body.filter), "next": None}
    outcome = bulk(conn, action, body.filter, actor=actor, limit=body.limit, after=body.after)
    return {"count": outcome.count, "next": outcome.next}


@router.post("/jobs/cancel", response_model=BulkResult, responses=ERRORS, **needs("operate"))
def cancel_matching(body: BulkRequest, conn: Conn, actor: Actor) -> dict:
    """Cancel every job matching the filter that has not finished, in batches (each a transaction
    of its own; each job's Cancelled carries its batch's id). `dry_run` only counts them."""
    return _bulk("cancel", body, conn, actor)


@router.post("/jobs/retry", response_model=BulkResult, responses=ERRORS, **needs("operate"))
def retry_matching(body: BulkRequest, conn: Conn, actor: Actor) -> dict:
    """Run again every dead or cancelled job matching the filter, in batches (a workflow's step
    with what its end skipped, as POST /jobs/{id}/retry does). `dry_run` only counts them."""
    return _bulk("retry", body, conn, actor)


@router.post("/jobs/{job_id}/cancel", response_model=JobView, responses=ERRORS, **needs("operate"))
def cancel(job_id: UUID, conn: Conn, actor: Actor, request: Request) -> dict:
    """Cancel a job that has not finished (409 otherwise); a running one stops at its next heartbeat."""
    cancel_job(conn, job_id, actor=actor)
    return _job(conn, job_id, request)


@router.post("/jobs/{job_id}/retry", response_model=JobView, responses=ERRORS, **needs("operate"))
def retry(job_id: UUID, conn: Conn, actor: Actor, request: Request) -> dict:
    """Run a dead or cancelled job again (409 for any other status)."""
    retry_job(conn, job_id, actor=actor)
    return _job(conn, job_id, request)
