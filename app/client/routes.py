"""The API's routes as methods, written once for Client and AsyncClient.

Each method describes its request (a Call: method, path, query, body and how to
read the answer) and hands it to `self._call`, which the sync client runs at once
and the async client returns as an awaitable. Answers are parsed with the API's
own models (qforge.api.models) and bodies validated with the commands' specs, so
there is no second copy of either.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, TypeVar
from uuid import UUID

from pydantic import BaseModel

from qforge.api import models
from qforge.client.errors import Invalid, JobFailed
from qforge.commands import errors
from qforge.commands.keys import KeySettingsSpec
from qforge.commands.bulk import BulkRequest
from qforge.commands.specs import JobSpec, WorkflowSpec, parse_spec
from qforge.events.states import JOB_FINISHED, SUCCEEDED
from qforge.workflows.durable import CodeWorkflowSpec


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    parse: Callable[[Any], Any]
    params: list[tuple[str, str]] | None = None
    body: Any = None
    text: bool = False  # the answer is text (GET /metrics): parse gets it as a str


# (HTTP method, the API's path template) -> the client method that calls it; every route of the
# API has one (tests/test_sdk.py fails naming any route that has none).
COVERED: dict[tuple[str, str], str] = {}
F = TypeVar("F", bound=Callable[..., Any])


def route(method: str, template: str) -> Callable[[F], F]:
    """Marks the client method that calls `method template` (as /openapi.json spells the path)."""
    def mark(function: F) -> F:
        COVERED[(method, template)] = function.__name__
        return function
    return mark


def _model(model: type[BaseModel]) -> Callable[[Any], Any]:
    return model.model_validate


def _events(body: Any) -> list[Any]:
    return [event.root for event in models.EventHistory.model_validate(body).events]


def _items(model: type[BaseModel]) -> Callable[[Any], Any]:
    return lambda body: model.model_validate(body).items


def query(**values: Any) -> list[tuple[str, str]]:
    """Query parameters without the unset ones; tags={"k": "v"} -> tag=k:v (all must match)."""
    params: list[tuple[str, str]] = []
    for name, value in values.items():
        if value is None:
            continue
        if name == "tags":
            params.extend(("tag", f"{key}:{item}") for key, item in value.items())
        else:
            params.append((name, str(value)))
    return params


def validated(model: type[BaseModel], data: Any) -> dict[str, Any]:
    """The JSON body of `data` checked by the API's own model, so bad input fails here, with the
    same Invalid (422) and details the API would answer."""
    try:
        spec = parse_spec(model, data)
    except errors.Invalid as exc:
        raise Invalid(422, "invalid", exc.message, exc.details) from None
    return spec.model_dump(mode="json", exclude_unset=True, by_alias=True)


class Routes:
    """Methods of both clients; `_call` is the one thing each client supplies (Client sends the
    call and returns its parsed result; AsyncClient returns an awaitable of it)."""

    _call: Callable[[Call], Any]

    # jobs ------------------------------------------------------------------
    @route("POST", "/jobs")
    def enqueue(self, task: str, payload: dict[str, Any] | None = None, **options: Any):
        """POST /jobs -> JobView. Options: queue, priority, max_retries, run_at, delay_seconds,
        timeout_seconds, tags, idempotency_key (the same key again returns the existing job)."""
        body = validated(JobSpec, {"task": task, "payload": payload or {}, **options})
        return self._call(Call("POST", "/jobs", _model(models.JobView), body=body))

    @route("GET", "/jobs/{job_id}")
    def get_job(self, job_id: UUID | str, *, as_of: int | None = None):
        """The job now, or as it was right after log position `as_of`."""
        return self._call(Call("GET", f"/jobs/{job_id}", _model(models.JobView), params=query(as_of=as_of)))

    @route("GET", "/jobs/{job_id}/events")
    def job_events(self, job_id: UUID | str):
        """The job's events, oldest first (typed: each is the API's model of its event type)."""
        return self._call(Call("GET", f"/jobs/{job_id}/events", _events))

    @route("POST", "/jobs/{job_id}/cancel")
    def cancel(self, job_id: UUID | str):
        return self._call(Call("POST", f"/jobs/{job_id}/cancel", _model(models.JobView)))

    @route("POST", "/jobs/{job_id}/retry")
    def retry(self, job_id: UUID | str):
        return self._call(Call("POST", f"/jobs/{job_id}/retry", _model(models.JobView)))

    @route("GET", "/jobs")
    def list_jobs(self, *, status: str | None = None, queue: str | None = None, task: str | None = None,
                  tags: dict[str, str] | None = None, limit: int | None = None, cursor: str | None = None):
        """One page: JobList(items, next); pass `next` as cursor for the following page."""
        return self._call(Call("GET", "/jobs", _model(models.JobList), params=query(
            status=status, queue=queue, task=task, tags=tags, limit=limit, cursor=cursor)))

    @route("POST", "/jobs/cancel")
    def cancel_matching(self, *, status: str | None = None, queue: str | None = None, task: str | None = None,
                        tags: dict[str, str] | None = None, dry_run: bool = False, limit: int | None = None,
                        after: UUID | str | None = None):
        """POST /jobs/cancel -> BulkResult(count, next): cancel every unfinished job matching all of
        the filters, in batches. `dry_run` only counts; `limit`/`after` go through them in parts."""
        return self._bulk("/jobs/cancel", status, queue, task, tags, dry_run, limit, after)

    @route("POST", "/jobs/retry")
    def retry_matching(self, *, status: str | None = None, queue: str | None = None, task: str | None = None,
                       tags: dict[str, str] | None = None, dry_run: bool = False, limit: int | None = None,
                       after: UUID | str | None = None):
        """POST /jobs/retry -> BulkResult(count, next): run again every dead or cancelled job matching
        all of the filters, in batches (as cancel_matching)."""
        return self._bulk("/jobs/retry", status, queue, task, tags, dry_run, limit, after)

    def _bulk(self, path: str, status, queue, task, tags, dry_run, limit, after):
        job_filter = {name: value for name, value in
                      (("status", status), ("queue", queue), ("task", task), ("tags", tags)) if value is not None}
        request: dict[str, Any] = {"filter": job_filter, "dry_run": dry_run}
        if limit is not None:
            request["limit"] = limit
        if after is not None:
            request["after"] = str(after)
        body = validated(BulkRequest, request)
        return self._call(Call("POST", path, _model(models.BulkResult), body=body))

    # workflows -------------------------------------------------------------
    @route("POST", "/workflows")
    def submit(self, workflow: WorkflowSpec | dict[str, Any]):
        """POST /workflows -> WorkflowCreated (id, name, status, steps)."""
        body = validated(WorkflowSpec, workflow)
        return self._call(Call("POST", "/workflows", _model(models.WorkflowCreated), body=body))

    @route("POST", "/workflows")
    def start(self, name: str, input: Any = None, **options: Any):
        """POST /workflows with code: start the code workflow `name` (@qforge.workflow) ->
        WorkflowCreated. Options: tags, idempotency_key, deadline_seconds, queue."""
        body = validated(CodeWorkflowSpec, {"code": name, "input": input, **options})
        return self._call(Call("POST", "/workflows", _model(models.WorkflowCreated), body=body))

    # Shaped like the job methods above: one method per route (their requests differ); Call and
    # _call are what they share.
    @route("GET", "/workflows/{workflow_id}")
    def get_workflow(self, workflow_id: UUID | str, *, as_of: int | None = None):
        """The workflow now, or as it was right after log position `as_of`."""
        return self._call(Call("GET", f"/workflows/{workflow_id}", _model(models.WorkflowView),
                               params=query(as_of=as_of)))

    @route("GET", "/workflows/{workflow_id}/events")
    def workflow_events(self, workflow_id: UUID | str):
        return self._call(Call("GET", f"/workflows/{workflow_id}/events", _events))

    @route("POST", "/workflows/{workflow_id}/cancel")
    def cancel_workflow(self, workflow_id: UUID | str):
        return self._call(Call("POST", f"/workflows/{workflow_id}/cancel", _model(models.WorkflowView)))

    @route("POST", "/workflows/{workflow_id}/steps/{step}/trigger")
    def trigger(self, workflow_id: UUID | str, step: str, payload: dict[str, Any] | None = None):
        """Complete a waiting wait_for_trigger step; `payload` becomes its output."""
        body = validated(models.TriggerRequest, {"payload": payload} if payload is not None else {})
        return self._call(Call("POST", f"/workflows/{workflow_id}/steps/{step}/trigger",
                               _model(models.WorkflowView), body=body))

    @route("GET", "/workflows")
    def list_workflows(self, *, status: str | None = None, name: str | None = None,
                       tags: dict[str, str] | None = None, limit: int | None = None,
                       cursor: str | None = None):
        return self._call(Call("GET", "/workflows", _model(models.WorkflowList), params=query(
            status=status, name=name, tags=tags, limit=limit, cursor=cursor)))

    # search, log, operations -----------------------------------------------
    @route("GET", "/executions")
    def executions(self, tags: dict[str, str], *, limit: int | None = None, cursor: str | None = None):
        """Jobs and workflows carrying all these tags (ExecutionList, newest first)."""
        return self._call(Call("GET", "/executions", _model(models.ExecutionList),
                               params=query(tags=tags, limit=limit, cursor=cursor)))

    @route("GET", "/events")
    def log(self, *, after: str | None = None, limit: int | None = None):
        """A page of the global log in order: EventPage(events, next)."""
        def parse(body: Any) -> Any:
            page = models.EventPage.model_validate(body)
            return page.model_copy(update={"events": [event.root for event in page.events]})
        return self._call(Call("GET", "/events", parse, params=query(after=after, limit=limit)))

    @route("GET", "/queues")
    def queues(self):
        return self._call(Call("GET", "/queues", _items(models.QueueList)))

    @route("GET", "/workers")
    def workers(self):
        return self._call(Call("GET", "/workers", _items(models.WorkerList)))

    @route("GET", "/healthz")
    def health(self):
        return self._call(Call("GET", "/healthz", _model(models.Health)))

    # keys (flow control) ---------------------------------------------------
    @route("GET", "/keys")
    def keys(self, *, limit: int | None = None, cursor: str | None = None):
        """Configured keys and the keys jobs used, by name: a list of KeyView (one page; limit up to 500)."""
        return self._call(Call("GET", "/keys", _items(models.KeyList), params=query(limit=limit, cursor=cursor)))

    @route("GET", "/keys/{name}")
    def key(self, name: str):
        """One key's settings, the limit in force and what runs (KeyView; NotFound if never seen)."""
        return self._call(Call("GET", f"/keys/{_segment(name)}", _model(models.KeyView)))

    @route("PUT", "/keys/{name}")
    def set_key(self, name: str, **settings: Any):
        """PUT /keys/{name} -> KeyView. Settings: concurrency_limit (None: each job's own), weight,
        rate_per_second (None: no limit), burst; those not given keep their value."""
        body = validated(KeySettingsSpec, settings)
        return self._call(Call("PUT", f"/keys/{_segment(name)}", _model(models.KeyView), body=body))

    @route("GET", "/keys/{name}/events")
    def key_events(self, name: str):
        """The key's KeyConfigured events, oldest first."""
        return self._call(Call("GET", f"/keys/{_segment(name)}/events", _events))


def _segment(value: str) -> str:
    """A path segment: a key may hold characters a URL path gives a meaning to."""
    return urllib.parse.quote(value, safe="")


def job_outcome(job: Any) -> tuple[bool, Any]:
    """wait()'s reading of a job: (finished, result); raises JobFailed when it ended badly."""
    if job.status == SUCCEEDED:
        return True, job.result
    if job.status in JOB_FINISHED:
        raise JobFailed(job)
    return False, None
