"""The HTTP side of issue 15: resume (and a step's retry re-opening its workflow), results, deadlines."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from tests.test_api import assert_error, serve
from tests.test_workflows import run_ready

BROKEN = {"name": "broken", "result": {"step": "b", "path": "n"}, "steps": [
    {"step": "a", "task": "echo", "max_retries": 0},
    {"step": "b", "task": "echo", "depends_on": ["a"], "max_retries": 0},
    {"step": "c", "task": "echo", "depends_on": ["b"], "max_retries": 0}]}


@pytest.fixture
def api(db_url: str) -> Iterator[httpx.Client]:
    yield from serve(db_url, api_token=None)


def step_statuses(workflow: dict) -> dict[str, str]:
    return {s["step"]: s["status"] for s in workflow["steps"]}


def test_resume_route_reruns_the_failed_part_and_409s_otherwise(api, conn):
    workflow = api.post("/workflows", json=BROKEN).json()
    assert_error(api.post(f"/workflows/{workflow['id']}/resume"), 409, "running")
    run_ready(conn)
    run_ready(conn, failures={"b"})
    failed = api.get(f"/workflows/{workflow['id']}").json()
    assert (failed["status"], failed["result"]) == ("failed", None)
    resumed = api.post(f"/workflows/{workflow['id']}/resume")
    assert resumed.status_code == 200, resumed.text
    assert step_statuses(resumed.json()) == {"a": "succeeded", "b": "pending", "c": "blocked"}
    assert run_ready(conn, outputs={"b": {"n": 7}}) == ["b"]
    assert run_ready(conn) == ["c"]
    done = api.get(f"/workflows/{workflow['id']}").json()
    assert (done["status"], done["result"], done["error"]) == ("succeeded", 7, None)
    assert_error(api.post(f"/workflows/{workflow['id']}/resume"), 409, "succeeded")
    history = api.get(f"/workflows/{workflow['id']}/events").json()["events"]
    types = [e["type"] for e in history]
    assert types.index("WorkflowFailed") < types.index("WorkflowResumed") < types.index("WorkflowSucceeded")
    assert types.count("StepReopened") == 2  # b and c; a's output was kept


def test_resume_of_an_unknown_workflow_is_404(api):
    assert_error(api.post("/workflows/00000000-0000-0000-0000-000000000000/resume"), 404)


def test_retry_of_a_dead_step_reopens_its_workflow(api, conn):
    workflow = api.post("/workflows", json=BROKEN).json()
    run_ready(conn)
    run_ready(conn, failures={"b"})
    dead = next(s for s in api.get(f"/workflows/{workflow['id']}").json()["steps"] if s["step"] == "b")
    retried = api.post(f"/jobs/{dead['job_id']}/retry")
    assert retried.status_code == 200, retried.text
    assert retried.json()["status"] == "pending"
    assert api.get(f"/workflows/{workflow['id']}").json()["status"] == "running"


def test_new_workflow_fields_are_validated_with_the_graph(api):
    body = {"name": "bad", "result": {"step": "ghost"}, "steps": [
        {"step": "a", "task": "echo", "depends_on": ["nope"]}]}
    error = assert_error(api.post("/workflows", json=body), 422, "ghost", "nope")
    assert len(error["details"]) >= 2
    assert_error(api.post("/workflows", json={**BROKEN, "deadline_seconds": -1}), 422, "deadline_seconds")
    assert api.get("/workflows").json()["items"] == []


def test_fan_out_step_shows_its_elements_by_status(api, conn):
    body = {"name": "fan", "steps": [
        {"step": "list", "task": "echo"},
        {"step": "each", "task": "echo", "for_each": {"step": "list", "path": "items"}, "max_parallel": 1}]}
    workflow = api.post("/workflows", json=body).json()
    run_ready(conn, outputs={"list": {"items": [1, 2, 3]}})
    run_ready(conn)
    each = next(s for s in api.get(f"/workflows/{workflow['id']}").json()["steps"] if s["step"] == "each")
    assert each["status"] == "waiting"
    assert each["elements"]["total"] == 3
    assert each["elements"]["counts"] == {"succeeded": 1, "pending": 1, "blocked": 1}
    bad = {"name": "bad", "steps": [{"step": "a", "task": "echo", "for_each": {"step": "a"},
                                     "max_parallel": 0}]}
    assert_error(api.post("/workflows", json=bad), 422, "max_parallel")
    bad["steps"][0]["max_parallel"] = 2
    assert_error(api.post("/workflows", json=bad), 422, "reads the step itself")


def test_waiting_on_shows_a_trigger_or_timer_wait_and_tag_search_filters_by_it(api, conn):
    body = {"name": "approval", "tags": {"team": "ops"}, "steps": [
        {"step": "prep", "task": "echo"},
        {"step": "approve", "type": "wait_for_trigger", "depends_on": ["prep"], "timeout_seconds": 3600},
        {"step": "ship", "task": "echo", "depends_on": ["approve"]}]}
    waiting = api.post("/workflows", json=body).json()
    napping = api.post("/workflows", json={"name": "nap", "tags": {"team": "ops"}, "steps": [
        {"step": "nap", "type": "sleep", "seconds": 600}]}).json()
    busy = api.post("/workflows", json={**body, "name": "busy"}).json()
    assert api.get(f"/workflows/{waiting['id']}").json()["waiting_on"] == []  # prep is due
    run_ready(conn, limit=1)  # one prep runs: its workflow waits on the trigger alone
    ids = {waiting["id"], busy["id"]}
    ran = [w for w in ids if api.get(f"/workflows/{w}").json()["waiting_on"]]
    assert len(ran) == 1
    [view] = [api.get(f"/workflows/{w}").json() for w in ran]
    assert [(w["step"], w["kind"]) for w in view["waiting_on"]] == [("approve", "trigger")]
    assert view["waiting_on"][0]["until"] is not None
    nap = api.get(f"/workflows/{napping['id']}").json()["waiting_on"]
    assert [(w["step"], w["kind"]) for w in nap] == [("nap", "timer")]
    found = api.get("/executions", params={"tag": "team:ops", "waiting": "trigger"}).json()["items"]
    assert [item["id"] for item in found] == ran
    timers = api.get("/executions", params={"tag": "team:ops", "waiting": "timer"}).json()["items"]
    assert [item["id"] for item in timers] == [napping["id"]]
    assert_error(api.get("/executions", params={"tag": "team:ops", "waiting": "nap"}), 422, "waiting")
