"""The client SDK against a real API (uvicorn in a thread) and a real worker process."""

from __future__ import annotations

import asyncio
from typing import Iterator

import httpx
import pytest

import qforge
from qforge.api.app import create_app
from qforge.api.models import JobView
from qforge.api.server import BackgroundServer
from qforge.settings import Settings
from test_dev import wait_until
from test_worker_support import Processes, procs, tasks_dir  # noqa: F401 (fixtures)


@pytest.fixture
def api(db_url: str) -> Iterator[str]:
    app = create_app(db_url, settings=Settings(database_url=db_url, api_token=None))
    with BackgroundServer(app) as running:
        yield running.url


@pytest.fixture
def client(api: str) -> Iterator[qforge.Client]:
    with qforge.Client(api) as sdk:
        yield sdk


@pytest.fixture
def worker(procs: Processes) -> Processes:
    procs.worker("--concurrency", "4")
    return procs


def test_enqueue_then_wait_returns_the_result_typed(client: qforge.Client, worker):
    job = client.enqueue("add", {"a": 2, "b": 3}, tags={"order": "o-1"}, priority=5)
    assert isinstance(job, JobView)
    assert (job.task, job.priority, job.tags) == ("add", 5, {"order": "o-1"})
    assert client.wait(job.id, timeout=30) == 5
    assert client.get_job(job.id).status == "succeeded"
    assert [e.type for e in client.job_events(job.id)][:2] == ["Enqueued", "Claimed"]
    again = client.enqueue("add", {"a": 2, "b": 3}, idempotency_key="k-1")
    assert client.enqueue("add", {"a": 9, "b": 9}, idempotency_key="k-1").id == again.id


def test_wait_raises_with_the_error_or_times_out(client: qforge.Client, worker):
    failing = client.enqueue("fail", max_retries=0)
    with pytest.raises(qforge.JobFailed) as failed:
        client.wait(failing.id, timeout=30)
    assert failed.value.job.status == "dead" and failed.value.error
    slow = client.enqueue("slow", {"seconds": 30})
    with pytest.raises(qforge.WaitTimeout) as late:
        client.wait(slow.id, timeout=0.5)
    assert isinstance(late.value, TimeoutError) and late.value.job.status in ("pending", "running")
    assert client.cancel(slow.id).status == "cancelled"
    assert client.retry(failing.id).id == failing.id  # it may already run again: the worker is quick
    assert [e.type for e in client.job_events(failing.id)].count("Retried") == 1


def test_errors_carry_the_api_code_message_and_details(client: qforge.Client):
    with pytest.raises(qforge.NotFound) as missing:
        client.get_job("00000000-0000-0000-0000-000000000000")
    assert (missing.value.status, missing.value.error) == (404, "not_found")
    with pytest.raises(qforge.Invalid) as local:  # refused before sending, as the API would
        client.enqueue("add", priority="high")
    assert local.value.details and local.value.details[0]["field"] == "priority"
    with pytest.raises(qforge.Invalid) as cyclic:  # refused by the API: every problem listed
        client.submit({"name": "loop", "steps": [{"step": "a", "task": "echo", "depends_on": ["b"]},
                                                 {"step": "b", "task": "echo", "depends_on": ["a"]}]})
    assert cyclic.value.error == "invalid" and any("cycle" in str(d) for d in cyclic.value.details)
    job = client.enqueue("echo")
    client.cancel(job.id)
    with pytest.raises(qforge.Conflict):
        client.cancel(job.id)
    assert issubclass(qforge.Conflict, qforge.ApiError)


def test_token_is_sent_and_a_missing_one_is_unauthorized(db_url: str):
    app = create_app(db_url, settings=Settings(database_url=db_url, api_token="s3cret"))
    with BackgroundServer(app) as running:
        with qforge.Client(running.url) as anonymous, pytest.raises(qforge.Unauthorized):
            anonymous.list_jobs()
        with qforge.Client(running.url, token="s3cret") as sdk:
            assert sdk.enqueue("echo").status == "pending"


def test_list_by_tag_with_paging(client: qforge.Client):
    ids = [client.enqueue("echo", {"n": n}, tags={"batch": "b7"}).id for n in range(5)]
    client.enqueue("echo", tags={"batch": "other"})
    page = client.list_jobs(tags={"batch": "b7"}, limit=2)
    assert len(page.items) == 2 and page.next
    assert sorted(j.id for j in client.iter_jobs(tags={"batch": "b7"}, limit=2)) == sorted(ids)
    found = client.executions({"batch": "b7"})
    assert len(found.items) == 5


def test_submit_trigger_and_list_workflows(client: qforge.Client, worker):
    created = client.submit({"name": "approve", "tags": {"t": "1"}, "steps": [
        {"step": "gate", "type": "wait_for_trigger"},
        {"step": "after", "task": "echo", "depends_on": ["gate"]}]})
    assert created.status == "running" and [s.step for s in created.steps] == ["gate", "after"]
    view = client.trigger(created.id, "gate", {"ok": True})
    assert view.steps[0].output == {"ok": True}
    with pytest.raises(qforge.Conflict):
        client.trigger(created.id, "gate")
    done = wait_until(lambda: (w := client.get_workflow(created.id)).status == "succeeded" and w, 30,
                      "the workflow")
    assert done.steps[1].status == "succeeded"
    assert [w.id for w in client.iter_workflows(tags={"t": "1"})] == [created.id]
    assert [e.type for e in client.workflow_events(created.id)][0] == "WorkflowSubmitted"
    assert client.health().status == "ok"
    assert any(q.queue == "default" for q in client.queues())
    assert client.workers()[0].concurrency == 4


class CuttingTransport(httpx.BaseTransport):
    """A proxy in the client's path that drops the event stream after every `every` messages."""

    def __init__(self, every: int):
        self.inner, self.every, self.cuts = httpx.HTTPTransport(), every, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.url.path != "/events/stream":
            return response
        transport = self

        class Cut(httpx.SyncByteStream):
            def __iter__(self):
                sent, buffer = 0, b""
                for chunk in response.stream:
                    buffer += chunk
                    while b"\n\n" in buffer or b"\r\n\r\n" in buffer:
                        end = buffer.find(b"\r\n\r\n") + 4 if b"\r\n\r\n" in buffer else buffer.find(b"\n\n") + 2
                        message, buffer = buffer[:end], buffer[end:]
                        yield message
                        if message.strip() and not message.lstrip().startswith(b":"):
                            sent += 1
                        if sent == transport.every:
                            transport.cuts += 1
                            raise httpx.ReadError("cut by the proxy")

            def close(self):
                response.close()

        return httpx.Response(response.status_code, headers=response.headers, stream=Cut(),
                              request=request)


def test_events_resume_after_every_cut_without_missing_or_repeating(api: str, client: qforge.Client):
    ids = {client.enqueue("echo", {"n": n}).id for n in range(10)}
    transport = CuttingTransport(every=3)
    with qforge.Client(api, http=httpx.Client(base_url=api, transport=transport)) as cut:
        seen = []
        for event in cut.events(after="0", type="Enqueued"):
            seen.append(event)
            if len(seen) == 10:
                break
    assert [e.stream_id for e in seen if e.stream_id in ids] == [e.stream_id for e in seen]
    assert {e.stream_id for e in seen} == ids and len(seen) == 10
    assert [e.position for e in seen] == sorted(e.position for e in seen)
    assert transport.cuts >= 3


def test_async_client_enqueues_waits_and_streams(api: str, worker):
    async def main() -> None:
        async with qforge.AsyncClient(api) as sdk:
            job = await sdk.enqueue("add", {"a": 40, "b": 2})
            assert await sdk.wait(job.id, timeout=30) == 42
            types = []
            async for event in sdk.events(after="0", job_id=str(job.id)):
                types.append(event.type)
                if event.type == "Succeeded":
                    break
            assert types[0] == "Enqueued" and types[-1] == "Succeeded"
            jobs = [j async for j in sdk.iter_jobs(task="add", limit=1)]
            assert [j.id for j in jobs] == [job.id]
            with pytest.raises(qforge.NotFound):
                await sdk.get_workflow(job.id)
    asyncio.run(main())
