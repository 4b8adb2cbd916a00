"""The SDK covers the whole API: every route has a method of Client and AsyncClient, and the methods
beyond jobs and workflows reach a real `qforge api` and come back typed with the API's models."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from qforge import AsyncClient, Client, Conflict, Invalid, NotFound
from qforge.api.app import create_app
from qforge.api.routes.definitions import DefinitionView
from qforge.api.models import WorkflowView
from qforge.api.routes.schedules import ScheduleView
from qforge.client.routes import COVERED
from qforge.commands.claim import claim
from qforge.commands.report import Report, fail
from qforge.producer import enqueue, submit
from qforge.settings import Settings
from remote_support import Remote, rconn  # noqa: F401 (fixtures)

conn = rconn


def test_every_route_of_the_api_has_a_client_method() -> None:
    app = create_app("postgresql://unused@/unused", settings=Settings(api_token=None))
    served = {(method.upper(), path) for path, operations in app.openapi()["paths"].items()
              for method in operations}
    missing = sorted(served - set(COVERED))
    assert not missing, ("routes of the API with no client method (add one to qforge/client/routes.py or"
                         " manage.py, marked @route(METHOD, PATH)): "
                         + ", ".join(f"{method} {path}" for method, path in missing))
    stale = sorted(set(COVERED) - served)
    assert not stale, f"client methods for routes the API does not have: {stale}"
    for name in set(COVERED.values()):
        assert callable(getattr(Client, name, None)) and callable(getattr(AsyncClient, name, None)), name


def test_definitions_runs_resume_and_proofs_through_the_client(remote: Remote, conn: psycopg.Connection) -> None:
    with Client(remote.base, token=remote.token) as client:
        first = client.put_definition("sdk-etl", {"steps": [{"step": "extract", "task": "echo"}]})
        assert isinstance(first, DefinitionView) and first.version == 1
        client.put_definition("sdk-etl", {"steps": [{"step": "extract", "task": "echo"},
                                                    {"step": "load", "task": "echo", "depends_on": ["extract"]}]})
        assert client.get_definition("sdk-etl").version == 2
        assert client.get_definition("sdk-etl", version=1).document["steps"][0]["step"] == "extract"
        assert "sdk-etl" in [d.name for d in client.list_definitions().items]
        run = client.run_definition("sdk-etl", {"day": 1}, version=1, tags={"via": "sdk"})
        assert isinstance(run, WorkflowView) and run.definition == {"name": "sdk-etl", "version": 1}
        with pytest.raises(NotFound):
            client.run_definition("sdk-etl", version=7)
        with pytest.raises(Invalid):
            client.run_definition("sdk-etl", version=0)  # refused before anything is sent

        workflow_id = submit(conn, {"name": "sdk-resume", "steps": [
            {"step": "only", "task": "fail", "max_retries": 0, "queue": "sdk-resume"}]})
        [job] = claim(conn, ["sdk-resume"], 1, "w")
        fail(conn, [Report(job.id, job.attempt, error="boom")], actor="w")
        assert client.get_workflow(workflow_id).status == "failed"
        resumed = client.resume(workflow_id)
        assert resumed.status == "running" and resumed.steps[0].status == "pending"
        with pytest.raises(Conflict):
            client.resume(workflow_id)

        proof = client.workflow_proof(workflow_id)
        assert proof["events"], proof
        job_id = enqueue(conn, "echo", {"n": 1})
        assert client.job_proof(job_id)["events"][0]["type"] == "Enqueued"
        position = client.job_events(job_id)[0].position
        assert client.get_job(job_id, as_of=position).status == "pending"


def test_schedules_queues_tokens_and_the_rest_through_the_client(remote: Remote) -> None:
    with Client(remote.base, token=remote.token) as client:
        client.put_definition("sdk-nightly", {"steps": [{"step": "a", "task": "echo"}]})
        made = client.create_schedule({"name": "sdk-nightly", "cron": "0 3 * * *", "definition": "sdk-nightly",
                                       "version": 1})
        assert isinstance(made, ScheduleView) and made.version == 1
        assert "sdk-nightly" in [s.name for s in client.list_schedules()]
        assert client.pause_schedule("sdk-nightly").paused is True
        assert client.resume_schedule("sdk-nightly").paused is False
        assert client.update_schedule("sdk-nightly", version=None).version is None
        assert [e.type for e in client.schedule_events("sdk-nightly")][0] == "ScheduleCreated"
        client.delete_schedule("sdk-nightly")
        with pytest.raises(NotFound):
            client.get_schedule("sdk-nightly")

        assert client.configure_queue("sdk-q", paused=True).paused is True
        made_token = client.create_token("sdk-reader", "read")
        assert made_token.token.startswith("qf")
        assert "sdk-reader" in [t.name for t in client.list_tokens()]
        client.revoke_token("sdk-reader")
        assert "sdk-reader" not in [t.name for t in client.list_tokens()]
        assert "sdk-reader" in [t.name for t in client.list_tokens(include_revoked=True)]
        assert client.stream_ticket().expires_in > 0
        assert client.recent_stats() is not None
        assert "qforge_" in client.metrics()
        compat = client.compat_submit("sdk-pods", [{"id": "one", "command": "true"}])
        assert compat.workflowId == "sdk-pods"
        assert client.compat_status("sdk-pods").steps[0].id == "one"
        assert client.pods().total >= 0


def test_the_async_client_has_the_same_methods(remote: Remote) -> None:
    async def go() -> None:
        async with AsyncClient(remote.base, token=remote.token) as client:
            await client.put_definition("sdk-async", {"steps": [{"step": "a", "task": "echo"}]})
            run = await client.run_definition("sdk-async", version=1)
            assert run.definition == {"name": "sdk-async", "version": 1}
            counted = await client.cancel_matching(queue="no-such-queue", dry_run=True)
            assert counted.count == 0
            assert "sdk-async" in [d.name for d in (await client.list_definitions()).items]
    asyncio.run(go())
