"""qforge.Client: the HTTP API from Python, blocking (httpx.Client)."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator
from uuid import UUID

import httpx

from qforge.api import models
from qforge.client.errors import Unreachable, WaitTimeout, error_of
from qforge.client.manage import ManageRoutes
from qforge.client.routes import Call, Routes, job_outcome, route
from qforge.client.sse import Resume, SseParser

def headers_of(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def answer(call: Call, response: httpx.Response) -> Any:
    """The parsed body of a 2xx answer; the matching ApiError otherwise."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code >= 400:
        raise error_of(response.status_code, body, response.text)
    return call.parse(response.text if call.text else body)


class Client(Routes, ManageRoutes):
    """`Client("http://127.0.0.1:8090", token=None)`; use as a context manager or call close()."""

    def __init__(self, base_url: str = "http://127.0.0.1:8090", token: str | None = None, *,
                 timeout: float = 30.0, http: httpx.Client | None = None):
        self.base_url = base_url.rstrip("/")
        self._http = http or httpx.Client(base_url=self.base_url, headers=headers_of(token), timeout=timeout)

    def _call(self, call: Call) -> Any:
        try:
            response = self._http.request(call.method, call.path, params=call.params, json=call.body)
        except httpx.TransportError as exc:
            raise Unreachable(f"{self.base_url}{call.path}", exc) from exc
        return answer(call, response)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _every(list_page: Callable[..., Any], filters: dict[str, Any]) -> Iterator[Any]:
        """Every item of a paged list (`list_page(**filters, cursor=...)`), page after page."""
        cursor = None
        while True:
            page = list_page(**filters, cursor=cursor)
            yield from page.items
            if not page.next:
                return
            cursor = page.next

    def iter_jobs(self, **filters: Any) -> Iterator[models.JobView]:
        """Every job matching the filters of list_jobs, page after page."""
        yield from self._every(self.list_jobs, filters)

    def iter_workflows(self, **filters: Any) -> Iterator[models.WorkflowSummary]:
        yield from self._every(self.list_workflows, filters)

    def wait(self, job_id: UUID | str, timeout: float = 60.0, *, poll_seconds: float = 0.2) -> Any:
        """The job's result once it succeeds; JobFailed if it ends dead, cancelled or skipped;
        WaitTimeout (a TimeoutError) if it is still going after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            finished, result = job_outcome(job)
            if finished:
                return result
            if time.monotonic() >= deadline:
                raise WaitTimeout(job, timeout)
            time.sleep(min(poll_seconds, max(0.0, deadline - time.monotonic())))

    @route("GET", "/events/stream")
    def events(self, after: str | int | None = None, *, retry_seconds: float = 0.5, **filters: Any) -> Iterator[Any]:
        """The live log (GET /events/stream) as typed events, forever: a dropped connection is
        resumed from the last event received (Last-Event-ID), so nothing is missed or repeated.
        `after=0` (or "0") replays from the beginning; None starts at the live tail. Filters:
        workflow_id, job_id, type, tags={"k": "v"}. Each event has `.position`; stop by breaking out."""
        resume = Resume(after, filters)
        while True:
            try:
                with self._http.stream("GET", "/events/stream", **resume.request(),
                                       timeout=httpx.Timeout(10.0, read=None)) as response:
                    if response.status_code >= 400:
                        response.read()
                        refused(response)
                    else:
                        parser = SseParser()
                        for line in response.iter_lines():
                            if (event := resume.read(parser, line)) is not None:
                                yield event
            except httpx.TransportError:
                pass
            resume.dropped()
            time.sleep(retry_seconds)


def refused(response: httpx.Response) -> None:
    """A stream request the API refused: raise its error, except 503 (the database is away a
    moment), which events() retries."""
    if response.status_code != 503:
        try:
            body = response.json()
        except ValueError:
            body = None
        raise error_of(response.status_code, body, response.text)
