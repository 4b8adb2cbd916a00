"""qforge.AsyncClient: the same methods as Client, awaitable (httpx.AsyncClient)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable
from uuid import UUID

import httpx

from qforge.api import models
from qforge.client.errors import Unreachable, WaitTimeout
from qforge.client.manage import ManageRoutes
from qforge.client.routes import Call, Routes, job_outcome
from qforge.client.sse import Resume, SseParser
from qforge.client.sync import answer, headers_of, refused


class AsyncClient(Routes, ManageRoutes):
    """`async with AsyncClient(base_url, token=None) as client: job = await client.enqueue("add", {...})`."""

    def __init__(self, base_url: str = "http://127.0.0.1:8090", token: str | None = None, *,
                 timeout: float = 30.0, http: httpx.AsyncClient | None = None):
        self.base_url = base_url.rstrip("/")
        self._http = http or httpx.AsyncClient(base_url=self.base_url, headers=headers_of(token),
                                               timeout=timeout)

    async def _call(self, call: Call) -> Any:
        try:
            response = await self._http.request(call.method, call.path, params=call.params, json=call.body)
        except httpx.TransportError as exc:
            raise Unreachable(f"{self.base_url}{call.path}", exc) from exc
        return answer(call, response)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @staticmethod
    async def _every(list_page: Callable[..., Any], filters: dict[str, Any]) -> AsyncIterator[Any]:
        """As Client._every: every item of a paged list, page after page."""
        cursor = None
        while True:
            page = await list_page(**filters, cursor=cursor)
            for item in page.items:
                yield item
            if not page.next:
                return
            cursor = page.next

    async def iter_jobs(self, **filters: Any) -> AsyncIterator[models.JobView]:
        async for item in self._every(self.list_jobs, filters):
            yield item

    async def iter_workflows(self, **filters: Any) -> AsyncIterator[models.WorkflowSummary]:
        async for item in self._every(self.list_workflows, filters):
            yield item

    async def wait(self, job_id: UUID | str, timeout: float = 60.0, *, poll_seconds: float = 0.2) -> Any:
        """As Client.wait."""
        deadline = time.monotonic() + timeout
        while True:
            job = await self.get_job(job_id)
            finished, result = job_outcome(job)
            if finished:
                return result
            if time.monotonic() >= deadline:
                raise WaitTimeout(job, timeout)
            await asyncio.sleep(min(poll_seconds, max(0.0, deadline - time.monotonic())))

    async def events(self, after: str | int | None = None, *, retry_seconds: float = 0.5,
                     **filters: Any) -> AsyncIterator[Any]:
        """As Client.events: typed events, resumed from the last one after a dropped connection."""
        resume = Resume(after, filters)
        while True:
            try:
                async with self._http.stream("GET", "/events/stream", **resume.request(),
                                             timeout=httpx.Timeout(10.0, read=None)) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        refused(response)
                    else:
                        parser = SseParser()
                        async for line in response.aiter_lines():
                            if (event := resume.read(parser, line)) is not None:
                                yield event
            except httpx.TransportError:
                pass
            resume.dropped()
            await asyncio.sleep(retry_seconds)
