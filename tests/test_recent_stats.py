"""GET /stats/recent: the dashboard's 15 minutes, folded from the log by the API process."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import httpx
import pytest

from qforge.api.app import create_app
from qforge.api.server import BackgroundServer
from qforge.commands.claim import claim
from qforge.commands.enqueue import enqueue
from qforge.commands.report import Report, complete, fail
from qforge.commands.specs import JobSpec, WorkflowSpec
from qforge.workflows.engine import submit
from qforge.settings import Settings


@pytest.fixture
def api(db_url: str):
    app = create_app(db_url, settings=Settings(database_url=db_url, api_token=None))
    with BackgroundServer(app) as running, httpx.Client(base_url=running.url) as client:
        yield client


def totals(body: dict) -> dict[str, float]:
    """Attempts finished in the window, by outcome (rates times the bucket length)."""
    return {name: round(sum(b[name] for b in body["throughput"]) * body["bucket_seconds"])
            for name in ("succeeded", "failed", "dead", "cancelled")}


def run_jobs(conn, count: int, *, task: str = "echo", ok: bool = True, now: datetime | None = None,
             max_retries: int = 0) -> None:
    enqueue(conn, [JobSpec(task=task, max_retries=max_retries) for _ in range(count)], now=now)
    claimed = claim(conn, ["default"], count, "w1", now=now)
    reports = [Report(job.id, job.attempt, result=1, error="boom") for job in claimed]
    (complete if ok else fail)(conn, reports, actor="w1", now=now)


def test_outcomes_and_latency_are_counted_once_per_event(api, conn):
    run_jobs(conn, 3)
    run_jobs(conn, 2, ok=False)
    first = api.get("/stats/recent").json()
    assert totals(first) == {"succeeded": 3, "failed": 2, "dead": 2, "cancelled": 0}
    assert len(first["throughput"]) == first["window_seconds"] // first["bucket_seconds"]
    started = [b for b in first["latency"] if b["count"]]
    assert sum(b["count"] for b in started) == 5 and started[-1]["p50"] is not None
    assert started[-1]["p50"] <= started[-1]["p99"] < 60

    run_jobs(conn, 4)  # only what was appended since is folded in: nothing counted twice
    second = api.get("/stats/recent").json()
    assert totals(second) == {"succeeded": 7, "failed": 2, "dead": 2, "cancelled": 0}


def test_events_older_than_the_window_are_left_out(api, conn):
    run_jobs(conn, 2, now=datetime.now(timezone.utc) - timedelta(minutes=20))
    run_jobs(conn, 1)
    body = api.get("/stats/recent").json()
    assert totals(body)["succeeded"] == 1
    assert sum(b["count"] for b in body["latency"]) == 1


def test_queue_depth_is_sampled_per_queue(api, conn):
    enqueue(conn, [JobSpec(task="echo", queue="mail") for _ in range(3)] + [JobSpec(task="echo")])
    body = api.get("/stats/recent").json()
    assert body["depth"][-1]["queues"] == {"mail": 3, "default": 1}


def test_workflows_filter_by_name(api, conn):
    submit(conn, WorkflowSpec.model_validate({"name": "nightly", "steps": [{"step": "a", "task": "echo"}]}))
    submit(conn, WorkflowSpec.model_validate({"name": "deploy", "steps": [{"step": "a", "task": "echo"}]}))
    items = api.get("/workflows", params={"name": "nightly"}).json()["items"]
    assert [w["name"] for w in items] == ["nightly"]
