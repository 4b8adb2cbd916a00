"""One trace per workflow run, through the API and a worker, read from the SDK's in-memory exporter:
submit -> every step's run -> the workflow's end; fan-out elements under a fan-out span;
a sub-workflow's submit under its parent's; a schedule's fires each a trace of their own, linked
to the schedule's creation."""

from __future__ import annotations

import asyncio
import signal
from datetime import timedelta
from typing import Any

import httpx
import psycopg

import qforge
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from qforge.api.app import create_app
from qforge.api.server import BackgroundServer
from qforge.commands import schedules
from qforge.settings import Settings
from qforge.workers.worker import Worker
from test_tracing import spans  # noqa: F401 (the in-memory exporter fixture)


def tree(finished: list[Any], root: Any) -> list[str]:
    """The spans under `root`, one line each, indented by depth (children in start order)."""
    children: dict[int, list[Any]] = {}
    for span in finished:
        if span.parent is not None:
            children.setdefault(span.parent.span_id, []).append(span)
    lines: list[str] = []

    def walk(span: Any, depth: int) -> None:
        names = {k.removeprefix("qforge."): v for k, v in (span.attributes or {}).items()
                 if k in ("qforge.step", "qforge.status", "qforge.workflow", "qforge.attempt", "qforge.elements")}
        lines.append("  " * depth + span.name + (f" {names}" if names else ""))
        for child in sorted(children.get(span.context.span_id, []), key=lambda s: s.start_time):
            walk(child, depth + 1)
    walk(root, 0)
    return lines


def run_until_done(db_url: str, api: BackgroundServer, settings: Settings, workflow_ids: list[str]) -> None:
    async def work() -> None:
        worker = Worker(db_url, name="traced", queues=["default"], concurrency=4, settings=settings)
        running = asyncio.create_task(worker.run())
        try:
            for _ in range(600):
                states = [(await asyncio.to_thread(httpx.get, f"{api.url}/workflows/{w}")).json()["status"]
                          for w in workflow_ids]
                if all(state != "running" for state in states):
                    assert set(states) == {"succeeded"}, states
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(f"workflows still running: {states}")
        finally:
            worker._on_signal(signal.SIGTERM)
            await running
    asyncio.run(work())


def test_a_workflow_run_its_fan_out_and_its_sub_workflow_are_one_trace(db_url: str, conn: psycopg.Connection,
                                                                        spans: InMemorySpanExporter) -> None:
    settings = Settings(database_url=db_url, api_token=None, poll_interval_seconds=0.1)
    caller = trace.get_tracer("the-web-app")
    with BackgroundServer(create_app(db_url, settings=settings)) as api:
        assert httpx.put(f"{api.url}/definitions/child", json={
            "steps": [{"step": "inner", "task": "echo"}]}).status_code == 201
        with caller.start_as_current_span("deploy") as deploy:
            headers: dict[str, str] = {}
            propagate.inject(headers)
            workflow = httpx.post(f"{api.url}/workflows", headers=headers, json={"name": "release", "steps": [
                {"step": "build", "task": "echo", "payload": {"items": [1, 2, 3]}},
                {"step": "test", "task": "echo", "for_each": {"step": "build", "path": "items"}},
                {"step": "sub", "type": "workflow", "definition": "child", "depends_on": ["build"]},
                {"step": "ship", "task": "echo", "depends_on": ["test", "sub"]}]}).json()
        run_until_done(db_url, api, settings, [workflow["id"]])

        made = httpx.post(f"{api.url}/schedules", json={"name": "hourly", "cron": "0 * * * *",
                                                        "job": {"task": "echo"}})
        assert made.status_code == 201, made.text
        due = schedules.get_schedule(conn, "hourly")["next_fire_at"]
        schedules.fire_due(conn, actor="monitor", grace_seconds=60, now=due)
        schedules.fire_due(conn, actor="monitor", grace_seconds=60, now=due + timedelta(hours=1))

    finished = list(spans.get_finished_spans())
    by_name: dict[str, list[Any]] = {}
    for span in finished:
        by_name.setdefault(span.name, []).append(span)
    trace_id = deploy.get_span_context().trace_id
    [submit] = [s for s in by_name["qforge.submit"] if s.attributes.get("qforge.workflow") == "release"]
    [child_submit] = [s for s in by_name["qforge.submit"] if s.attributes.get("qforge.workflow") == "child"]
    assert submit.context.trace_id == trace_id and child_submit.context.trace_id == trace_id
    assert child_submit.parent.span_id == submit.context.span_id, "the sub-workflow is not its parent's child"

    runs = [s for s in by_name["qforge.run"] if s.context.trace_id == trace_id]
    steps = {s.attributes["qforge.step"]: s for s in runs}
    # (the sub step runs no task: its child workflow is its work)
    assert set(steps) == {"build", "test[0]", "test[1]", "test[2]", "ship", "inner"}, sorted(steps)
    for name in ("build", "ship"):
        assert steps[name].parent.span_id == submit.context.span_id, name
    assert steps["inner"].parent.span_id == child_submit.context.span_id
    [fan_out] = by_name["qforge.fan_out"]
    assert fan_out.parent.span_id == submit.context.span_id
    elements = [s for s in runs if s.attributes.get("qforge.step", "").startswith("test[")]
    assert len(elements) == 3 and {s.parent.span_id for s in elements} == {fan_out.context.span_id}

    ends = {s.attributes["qforge.workflow_id"]: s for s in by_name["qforge.workflow.end"]}
    assert ends[workflow["id"]].parent.span_id == submit.context.span_id
    assert ends[workflow["id"]].attributes["qforge.status"] == "succeeded"
    assert any(s.parent.span_id == child_submit.context.span_id for s in ends.values())

    [created] = by_name["qforge.schedule.create"]
    fires = by_name["qforge.schedule.fire"]
    assert len(fires) == 2 and len({s.context.trace_id for s in fires}) == 2
    for fire in fires:
        assert fire.parent is None and fire.context.trace_id != created.context.trace_id
        assert [link.context.span_id for link in fire.links] == [created.context.span_id]
        [enqueue] = [s for s in by_name["qforge.enqueue"] if s.parent and s.parent.span_id == fire.context.span_id]
        assert enqueue.attributes["qforge.task"] == "echo"

    root = next(s for s in finished if s.context.span_id == deploy.get_span_context().span_id)
    print("\n".join(tree(finished, root)))


@qforge.workflow("traced_code")
def traced_code(ctx, inp):
    first = ctx.run("echo", {"n": 1}, step="first")
    both = ctx.gather(ctx.start("echo", {"n": 2}, step="left"), ctx.start("echo", {"n": 3}, step="right"))
    return {"first": first, "both": both}


def test_a_code_workflow_run_is_one_trace_with_a_span_per_step(db_url: str, spans: InMemorySpanExporter) -> None:
    """POST /workflows {"code"} under the caller's span: qforge.submit, then each step's and each run
    of the function's qforge.run as its children, and qforge.workflow.end: one trace."""
    settings = Settings(database_url=db_url, api_token=None, poll_interval_seconds=0.1)
    caller = trace.get_tracer("the-web-app")
    with BackgroundServer(create_app(db_url, settings=settings)) as api:
        with caller.start_as_current_span("checkout") as checkout:
            headers: dict[str, str] = {}
            propagate.inject(headers)
            made = httpx.post(f"{api.url}/workflows", headers=headers, json={"code": "traced_code"})
            assert made.status_code == 201, made.text
        run_until_done(db_url, api, settings, [made.json()["id"]])
    trace_id = checkout.get_span_context().trace_id
    finished = [s for s in spans.get_finished_spans() if s.context.trace_id == trace_id]
    [submit] = [s for s in finished if s.name == "qforge.submit"]
    assert submit.attributes["qforge.workflow"] == "traced_code"
    runs = {s.attributes["qforge.step"]: s for s in finished if s.name == "qforge.run"}
    # @2 and @3 run inline in the reports of first and of the gather (or as jobs, if slow): a span either way
    assert {"first", "left", "right", "@1", "@2", "@3"} <= set(runs), sorted(runs)
    assert {s.parent.span_id for s in runs.values()} == {submit.context.span_id}
    [end] = [s for s in finished if s.name == "qforge.workflow.end"]
    assert end.parent.span_id == submit.context.span_id and end.attributes["qforge.status"] == "succeeded"
