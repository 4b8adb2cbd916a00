"""The HTTP API over real HTTP (uvicorn on a free port) against a real database: every
route of the public API, its happy path and its bad input."""

from __future__ import annotations

import importlib.util
import re
import time
from typing import Iterator
from uuid import uuid4

import httpx
import pytest

from factories import count
from qforge.api.app import WEB_DIR, create_app
from qforge.api.server import BackgroundServer
from qforge.commands.claim import claim
from qforge.commands.report import Report, complete, fail
from qforge.settings import Settings

JOB_KEYS = {"id", "task", "queue", "status", "priority", "attempts", "max_retries", "run_at",
            "payload", "result", "last_error", "tags", "workflow_id", "step", "worker",
            "heartbeat_at", "created_at", "updated_at", "concurrency_key", "concurrency_limit", "fairness_key",
            "waiting_for_worker",
            "counted_attempts"}  # issue 29: why a pending job may wait for a worker that is not there
WORKFLOW_KEYS = {"id", "name", "status", "tags", "created_at", "finished_at", "steps",
                 # wave 2 (issue 15): what it returned, why it failed, its deadline
                 "result", "error", "deadline_at", "definition", "parent",
                 "waiting_on", "deadline_seconds",
                 # wave 3 (issue 32): a workflow written as code names its function and input
                 "code", "input",
                 "outcome"}
STEP_KEYS = {"step", "status", "job_id", "depends_on", "output", "error", "attempts",
             "started_at", "finished_at"}
ERROR_KEYS = {"error", "message", "details"}
CI_DAG = {"name": "ci", "steps": [
    {"step": "build", "task": "echo"},
    {"step": "test", "task": "echo", "depends_on": ["build"]},
    {"step": "lint", "task": "echo", "depends_on": ["build"]},
    {"step": "deploy", "task": "echo", "depends_on": ["test", "lint"]}]}


def serve(db_url: str, **settings) -> Iterator[httpx.Client]:
    app = create_app(db_url, settings=Settings(database_url=db_url, **settings))
    with BackgroundServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


@pytest.fixture
def api(db_url: str) -> Iterator[httpx.Client]:
    yield from serve(db_url, api_token=None)


def assert_error(response: httpx.Response, status: int, *words: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == ERROR_KEYS, body
    for word in words:
        assert word in body["message"] or word in str(body["details"]), (word, body)
    return body


def run_job(conn, result=None, *, error: str | None = None, queue: str = "default"):
    """Claim the next job of a queue and report it succeeded (or failed with `error`)."""
    [job] = claim(conn, [queue], 1, "test-worker")
    report = Report(job.id, job.attempt, result=result, error=error)
    (fail if error else complete)(conn, [report], actor="test-worker")
    return job


# ---------------------------------------------------------------------------- jobs


def test_enqueue_returns_201_with_the_job_in_the_contract_shape(api):
    response = api.post("/jobs", json={"task": "add", "payload": {"a": 2, "b": 3}, "priority": 5,
                                       "max_retries": 3, "tags": {"order_id": "o-1"}})
    assert response.status_code == 201
    job = response.json()
    assert set(job) == JOB_KEYS
    assert (job["task"], job["queue"], job["status"], job["priority"], job["attempts"],
            job["max_retries"], job["tags"]) == ("add", "default", "pending", 5, 0, 3, {"order_id": "o-1"})
    assert api.get(f"/jobs/{job['id']}").json() == job


def test_same_idempotency_key_returns_200_with_the_existing_job(api):
    first = api.post("/jobs", json={"task": "echo", "idempotency_key": "k-1"})
    again = api.post("/jobs", json={"task": "echo", "payload": {"x": 1}, "idempotency_key": "k-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert len(api.get("/jobs").json()["items"]) == 1


def test_delay_seconds_and_run_at_schedule_the_job(api):
    delayed = api.post("/jobs", json={"task": "echo", "delay_seconds": 3600}).json()
    assert delayed["run_at"] > delayed["created_at"]
    at = api.post("/jobs", json={"task": "echo", "run_at": "2031-01-01T00:00:00Z"}).json()
    assert at["run_at"].startswith("2031-01-01T00:00:00")


@pytest.mark.parametrize("body, field", [
    ({}, "task"),
    ({"task": "echo", "colour": "red"}, "colour"),
    ({"task": "echo", "priority": "high"}, "priority"),
    ({"task": "echo", "payload": [1, 2]}, "payload"),
    ({"task": "echo", "max_retries": -1}, "max_retries"),
    ({"task": "echo", "queue": "no spaces"}, "queue"),
    ({"task": "echo", "tags": {"a:b": "c"}}, "tags"),
    ({"task": "echo", "tags": {"k": 1}}, "tags"),
    ({"task": "echo", "run_at": "yesterday"}, "run_at"),
    ({"task": "echo", "run_at": "2030-01-01T00:00:00Z", "delay_seconds": 1}, "delay_seconds"),
    ({"task": "echo\u0000"}, "NUL"),
    ({"task": "echo", "payload": {"k": "a\u0000b"}}, "NUL"),
    ({"task": "echo", "payload": {"k": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
        ]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}, "nested"),
    ([{"task": "echo"}], "body"),
])
def test_bad_job_input_is_a_422_naming_the_field(api, body, field):
    assert_error(api.post("/jobs", json=body), 422, field)
    assert api.get("/jobs").json()["items"] == []


def test_malformed_json_is_a_400(api):
    response = api.post("/jobs", content=b'{"task": "echo",', headers={"content-type": "application/json"})
    assert_error(response, 400, "JSON")


@pytest.mark.parametrize("raw, word", [
    (b'{"task": "echo", "payload": {"x": NaN}}', "NaN"),
    (b'{"task": "echo", "payload": {"x": 1e400}}', "Infinity"),
    (b'{"task": "echo", "payload": {"x": "\\ud800"}}', "surrogate"),
])
def test_json_that_postgresql_cannot_store_is_refused(api, raw, word):
    assert_error(api.post("/jobs", content=raw, headers={"content-type": "application/json"}), 422, word)


def test_body_over_the_limit_is_a_413_by_length_and_by_counting(db_url):
    for client in serve(db_url, api_token=None, max_body_bytes=1000):
        big = {"task": "echo", "payload": {"blob": "x" * 2000}}
        assert_error(client.post("/jobs", json=big), 413, "limit")

        def chunks():  # no Content-Length: the server has to count
            yield b'{"task": "echo", "payload": {"blob": "'
            for _ in range(10):
                yield b"y" * 200
            yield b'"}}'

        response = client.post("/jobs", content=chunks(), headers={"content-type": "application/json"})
        assert_error(response, 413, "limit")
        assert client.post("/jobs", json={"task": "echo"}).status_code == 201


def test_unknown_job_is_404_and_a_malformed_id_is_404_naming_the_parameter(api):
    assert_error(api.get(f"/jobs/{uuid4()}"), 404, "not found")
    assert_error(api.get("/jobs/not-a-uuid"), 404, "job_id")
    assert_error(api.get(f"/jobs/{uuid4()}/events"), 404)
    assert_error(api.post(f"/jobs/{uuid4()}/cancel"), 404)
    assert_error(api.post("/jobs/12/retry"), 404, "job_id")


def test_job_list_filters_and_pages(api, conn):
    ids = [api.post("/jobs", json={"task": task, "queue": queue, "tags": tags}).json()["id"]
           for task, queue, tags in [("echo", "default", {"order_id": "1"}),
                                     ("add", "emails", {"order_id": "2"}),
                                     ("echo", "emails", {"order_id": "1", "region": "eu"})]]
    run_job(conn, queue="default")
    assert [j["id"] for j in api.get("/jobs").json()["items"]] == ids[::-1]  # newest first
    assert [j["id"] for j in api.get("/jobs", params={"status": "succeeded"}).json()["items"]] == [ids[0]]
    assert [j["id"] for j in api.get("/jobs", params={"queue": "emails"}).json()["items"]] == ids[:0:-1]
    assert [j["id"] for j in api.get("/jobs", params={"task": "add"}).json()["items"]] == [ids[1]]
    assert [j["id"] for j in api.get("/jobs", params={"tag": "order_id:1"}).json()["items"]] == [ids[2], ids[0]]
    both = api.get("/jobs", params=[("tag", "order_id:1"), ("tag", "region:eu")]).json()
    assert [j["id"] for j in both["items"]] == [ids[2]]

    page = api.get("/jobs", params={"limit": 2}).json()
    assert len(page["items"]) == 2 and page["next"]
    rest = api.get("/jobs", params={"limit": 2, "cursor": page["next"]}).json()
    assert [j["id"] for j in rest["items"]] == [ids[0]] and rest["next"] is None


@pytest.mark.parametrize("params, status, word", [
    ({"status": "sleeping"}, 422, "status"),
    ({"limit": 0}, 422, "limit"),
    ({"limit": "many"}, 422, "limit"),
    ({"cursor": "!!not-a-cursor!!"}, 400, "cursor"),
    ({"tag": "no-colon"}, 400, "key:value"),
])
def test_bad_list_queries_are_4xx_naming_the_parameter(api, params, status, word):
    assert_error(api.get("/jobs", params=params), status, word)


def test_job_history_is_the_audit_trail_oldest_first(api, conn):
    job = api.post("/jobs", json={"task": "flaky", "max_retries": 0}).json()
    run_job(conn, error="boom")
    history = api.get(f"/jobs/{job['id']}/events").json()
    assert set(history) == {"events"}
    assert [e["type"] for e in history["events"]] == ["Enqueued", "Claimed", "Failed", "DeadLettered"]
    event = history["events"][2]
    assert {"position", "stream_type", "stream_id", "version", "type", "data", "tags",
            "occurred_at", "actor"} <= set(event)
    assert event["data"]["reason"] == "error" and event["data"]["error"] == "boom"
    assert api.get(f"/jobs/{job['id']}").json()["status"] == "dead"


def test_cancel_and_retry_follow_the_state_machine(api, conn):
    job = api.post("/jobs", json={"task": "echo"}).json()
    assert_error(api.post(f"/jobs/{job['id']}/retry"), 409, "pending")
    cancelled = api.post(f"/jobs/{job['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert_error(api.post(f"/jobs/{job['id']}/cancel"), 409, "cancelled")
    retried = api.post(f"/jobs/{job['id']}/retry")
    assert retried.status_code == 200 and retried.json()["status"] == "pending"
    run_job(conn, {"ok": True})
    assert api.get(f"/jobs/{job['id']}").json()["result"] == {"ok": True}
    assert_error(api.post(f"/jobs/{job['id']}/cancel"), 409, "succeeded")


def test_as_of_shows_an_earlier_state_of_a_job(api, conn):
    job = api.post("/jobs", json={"task": "echo"}).json()
    run_job(conn, 1)
    [enqueued, *_] = api.get(f"/jobs/{job['id']}/events").json()["events"]
    response = api.get(f"/jobs/{job['id']}", params={"as_of": enqueued["position"]})
    if importlib.util.find_spec("qforge.projections.asof") is None:
        assert_error(response, 501)
        return
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "pending"
    assert set(response.json()) == JOB_KEYS
    assert api.get(f"/jobs/{job['id']}").json()["status"] == "succeeded"
    assert_error(api.get(f"/jobs/{job['id']}", params={"as_of": 0}), 404)
    assert_error(api.get(f"/jobs/{job['id']}", params={"as_of": -1}), 422, "as_of")

    workflow = api.post("/workflows", json=CI_DAG).json()
    submitted = api.get(f"/workflows/{workflow['id']}/events").json()["events"][-1]["position"]
    run_job(conn, "built")
    past = api.get(f"/workflows/{workflow['id']}", params={"as_of": submitted}).json()
    assert set(past) == WORKFLOW_KEYS
    assert [s["status"] for s in past["steps"]] == ["pending", "blocked", "blocked", "blocked"]
    assert api.get(f"/workflows/{workflow['id']}").json()["steps"][0]["status"] == "succeeded"


# ---------------------------------------------------------------------------- workflows


def test_submit_workflow_returns_201_and_get_has_the_contract_shape(api):
    response = api.post("/workflows", json={**CI_DAG, "tags": {"order_id": "o-9"}})
    assert response.status_code == 201
    created = response.json()
    assert set(created) == {"id", "name", "status", "steps", "code"} and created["code"] is None  # code: issue 32
    assert (created["name"], created["status"]) == ("ci", "running")
    workflow = api.get(f"/workflows/{created['id']}").json()
    assert set(workflow) == WORKFLOW_KEYS
    assert workflow["tags"] == {"order_id": "o-9"} and workflow["finished_at"] is None
    # the contract's keys, plus what the dashboard draws the DAG with
    assert all(set(step) == STEP_KEYS | {"type", "task", "when", "on_failure", "elements",
                                           "child_workflow_id",
                                           # issue 29: what a step was declared with comes back
                                           "seconds", "for_each", "max_parallel", "definition", "inputs",
                                           "input"}
               for step in workflow["steps"])
    assert [(s["step"], s["status"], s["depends_on"]) for s in workflow["steps"]] == [
        ("build", "pending", []), ("test", "blocked", ["build"]), ("lint", "blocked", ["build"]),
        ("deploy", "blocked", ["test", "lint"])]


def test_workflow_runs_to_success_through_its_steps(api, conn):
    workflow_id = api.post("/workflows", json=CI_DAG).json()["id"]
    for _ in range(4):
        run_job(conn, {"done": True})
    workflow = api.get(f"/workflows/{workflow_id}").json()
    assert workflow["status"] == "succeeded" and workflow["finished_at"]
    assert {s["status"] for s in workflow["steps"]} == {"succeeded"}
    assert workflow["steps"][0]["output"] == {"done": True}
    types = [e["type"] for e in api.get(f"/workflows/{workflow_id}/events").json()["events"]]
    assert types[0] == "WorkflowSubmitted" and types[-1] == "WorkflowSucceeded"


def test_workflow_idempotency_key_returns_200_with_the_same_workflow(api):
    first = api.post("/workflows", json={**CI_DAG, "idempotency_key": "wf-k"})
    again = api.post("/workflows", json={**CI_DAG, "idempotency_key": "wf-k"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]


def test_invalid_graph_is_a_422_listing_every_problem_and_stores_nothing(api):
    response = api.post("/workflows", json={"name": "bad", "steps": [
        {"step": "a", "task": "echo", "depends_on": ["ghost"]},
        {"step": "a", "task": "echo"},
        {"step": "b", "task": "echo", "depends_on": ["c"]},
        {"step": "c", "task": "echo", "depends_on": ["b"]},
        {"step": "d", "task": "echo", "when": {"step": "nowhere", "equals": 1}},
        {"step": "e", "task": "echo", "on_failure": "missing"},
        {"step": "f", "type": "teleport"},
    ]})
    body = assert_error(response, 422, "ghost", "duplicate", "cycle", "nowhere", "missing", "teleport")
    assert len(body["details"]) >= 6
    assert api.get("/workflows").json()["items"] == []


@pytest.mark.parametrize("body, word", [
    ({"steps": [{"step": "a", "task": "echo"}]}, "name"),
    ({"name": "x", "steps": []}, "steps"),
    ({"name": "x", "steps": [{"step": "a", "task": "echo", "retries": 2}]}, "retries"),
    ({"name": "x", "steps": "a"}, "steps"),
])
def test_malformed_workflow_bodies_are_422(api, body, word):
    assert_error(api.post("/workflows", json=body), 422, word)


def test_branch_handler_and_trigger(api, conn):
    workflow = api.post("/workflows", json={"name": "branch", "steps": [
        {"step": "a", "task": "echo", "payload": {"X": "doB"}},
        {"step": "b", "task": "echo", "when": {"step": "a", "path": "X", "equals": "doB"}},
        {"step": "c", "task": "echo", "when": {"step": "a", "path": "X", "equals": "doC"}},
        {"step": "approve", "type": "wait_for_trigger", "depends_on": ["b"]},
    ]}).json()
    run_job(conn, {"X": "doB"})  # a
    run_job(conn, {"did": "b"})  # b
    steps = {s["step"]: s for s in api.get(f"/workflows/{workflow['id']}").json()["steps"]}
    assert (steps["b"]["status"], steps["c"]["status"], steps["approve"]["status"]) == (
        "succeeded", "skipped", "waiting")
    assert steps["approve"]["started_at"] is not None
    path = f"/workflows/{workflow['id']}/steps"
    assert_error(api.post(f"{path}/b/trigger", json={}), 409, "waiting")
    assert_error(api.post(f"{path}/nope/trigger", json={}), 404, "nope")
    assert_error(api.post(f"{path}/approve/trigger", json={"payload": 1}), 422, "payload")
    done = api.post(f"{path}/approve/trigger", json={"payload": {"by": "ops"}})
    assert done.status_code == 200
    assert done.json()["status"] == "succeeded"
    assert done.json()["steps"][-1]["output"] == {"by": "ops"}
    assert_error(api.post(f"{path}/approve/trigger"), 409)


def test_workflow_list_cancel_and_history(api):
    kept = api.post("/workflows", json={**CI_DAG, "tags": {"team": "a"}}).json()
    gone = api.post("/workflows", json={**CI_DAG, "tags": {"team": "b"}}).json()
    cancelled = api.post(f"/workflows/{gone['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert {s["status"] for s in cancelled.json()["steps"]} == {"cancelled"}
    assert_error(api.post(f"/workflows/{gone['id']}/cancel"), 409, "cancelled")
    listed = api.get("/workflows").json()
    assert [w["id"] for w in listed["items"]] == [gone["id"], kept["id"]] and listed["next"] is None
    assert [w["id"] for w in api.get("/workflows", params={"status": "running"}).json()["items"]] == [kept["id"]]
    assert [w["id"] for w in api.get("/workflows", params={"tag": "team:b"}).json()["items"]] == [gone["id"]]
    assert api.get("/workflows", params={"limit": 1}).json()["next"]
    assert_error(api.get("/workflows", params={"status": "nope"}), 422, "status")
    history = api.get(f"/workflows/{gone['id']}/events").json()["events"]
    assert history[-1]["type"] == "WorkflowCancelled"
    assert_error(api.get(f"/workflows/{uuid4()}"), 404)
    assert_error(api.get(f"/workflows/{uuid4()}/events"), 404)
    assert_error(api.post(f"/workflows/{uuid4()}/cancel"), 404)
    assert_error(api.get("/workflows/xyz"), 404, "workflow_id")


# ---------------------------------------------------------------------------- compat (seed 001)

SEED_WORKFLOW = {"workflowId": "wf-123", "steps": [
    {"id": "A", "command": "echo hello"},
    {"id": "B", "command": "ls /", "dependsOn": ["A"]},
    {"id": "C", "command": "pwd", "dependsOn": ["A"]},
    {"id": "D", "command": "date", "dependsOn": ["B", "C"]}]}


def test_pod_orchestrator_routes(api, conn):
    response = api.post("/workflow", json=SEED_WORKFLOW)
    assert response.status_code == 201
    view = response.json()
    assert set(view) == {"workflowId", "status", "steps"}
    assert view["workflowId"] == "wf-123" and view["status"] == "RUNNING"
    assert [(s["id"], s["status"], s["dependsOn"]) for s in view["steps"]] == [
        ("A", "QUEUED", []), ("B", "PENDING", ["A"]), ("C", "PENDING", ["A"]), ("D", "PENDING", ["B", "C"])]
    assert set(view["steps"][0]) == {"id", "command", "dependsOn", "status", "stdout", "exitCode",
                                     "startedAt", "finishedAt", "lastHeartbeatAt"}
    assert api.post("/workflow", json=SEED_WORKFLOW).status_code == 200  # same workflowId

    [job] = claim(conn, ["default"], 1, "pool-1")
    assert job.task == "shell" and job.payload == {"command": "echo hello"}
    running = api.get("/workflow/wf-123").json()["steps"][0]
    assert running["status"] == "RUNNING" and running["lastHeartbeatAt"] and running["startedAt"]
    complete(conn, [Report(job.id, job.attempt, result={"exit_code": 0, "stdout": "hello\n", "stderr": ""})],
             actor="pool-1")
    [b] = claim(conn, ["default"], 1, "pool-1")
    fail(conn, [Report(b.id, b.attempt, error="exit 2",
                       result={"exit_code": 2, "stdout": "", "stderr": "nope"})], actor="pool-1")
    [c] = claim(conn, ["default"], 1, "pool-1")
    complete(conn, [Report(c.id, c.attempt, result={"exit_code": 0, "stdout": "/\n", "stderr": ""})],
             actor="pool-1")
    final = api.get("/workflow/wf-123").json()
    steps = {s["id"]: s for s in final["steps"]}
    assert final["status"] == "FAILED"
    assert (steps["A"]["status"], steps["A"]["stdout"], steps["A"]["exitCode"]) == ("COMPLETED", "hello\n", 0)
    assert (steps["B"]["status"], steps["B"]["exitCode"]) == ("FAILED", 2)
    assert (steps["C"]["status"], steps["D"]["status"]) == ("COMPLETED", "SKIPPED")
    assert steps["A"]["finishedAt"]

    assert_error(api.get("/workflow/wf-unknown"), 404)
    pods = api.get("/pods").json()
    assert pods == {"total": 0, "available": 0, "leased": []}


@pytest.mark.parametrize("body", [
    {"workflowId": "bad", "steps": [{"id": "A", "command": "x", "dependsOn": ["A"]}]},
    {"workflowId": "bad", "steps": [{"id": "A", "command": "x"}, {"id": "A", "command": "y"}]},
    {"workflowId": "bad", "steps": [{"id": "A", "command": "x", "dependsOn": ["B"]},
                                    {"id": "B", "command": "y", "dependsOn": ["A"]}]},
    {"workflowId": "bad", "steps": [{"id": "A", "command": "x", "dependsOn": ["Z"]}]},
    {"workflowId": "bad", "steps": []},
    {"steps": [{"id": "A", "command": "x"}]},
])
def test_pod_orchestrator_invalid_graph_is_400(api, body):
    assert_error(api.post("/workflow", json=body), 400)
    assert_error(api.get("/workflow/bad"), 404)


# ---------------------------------------------------------------------------- search, events, ops


def test_executions_are_the_intersection_of_tags(api):
    a = api.post("/jobs", json={"task": "echo", "tags": {"order_id": "7", "region": "eu"}}).json()
    b = api.post("/jobs", json={"task": "echo", "tags": {"order_id": "7", "region": "us"}}).json()
    w = api.post("/workflows", json={"name": "w", "tags": {"order_id": "7"},
                                     "steps": [{"step": "s", "task": "echo"}]}).json()
    api.post("/jobs", json={"task": "echo", "tags": {"order_id": "8"}})
    found = api.get("/executions", params={"tag": "order_id:7"}).json()
    kinds = {(item["kind"], item["id"]) for item in found["items"]}
    step_job = w["steps"][0]["job_id"]
    assert kinds == {("job", a["id"]), ("job", b["id"]), ("workflow", w["id"]), ("job", step_job)}
    both = api.get("/executions", params=[("tag", "order_id:7"), ("tag", "region:eu")]).json()
    assert [(i["kind"], i["id"]) for i in both["items"]] == [("job", a["id"])]
    page = api.get("/executions", params={"tag": "order_id:7", "limit": 3}).json()
    assert len(page["items"]) == 3
    rest = api.get("/executions", params={"tag": "order_id:7", "limit": 3, "cursor": page["next"]}).json()
    assert len(rest["items"]) == 1 and rest["next"] is None
    assert api.get("/executions", params={"tag": "order_id:nothing"}).json() == {"items": [], "next": None}
    assert_error(api.get("/executions"), 422, "tag")
    assert_error(api.get("/executions", params={"tag": ":x"}), 400, "key:value")


def test_event_log_pages_with_a_cursor(api):
    for n in range(5):
        api.post("/jobs", json={"task": "echo", "payload": {"n": n}})
    first = api.get("/events", params={"after": "0", "limit": 3}).json()
    assert [e["data"]["payload"]["n"] for e in first["events"]] == [0, 1, 2]
    rest = api.get("/events", params={"after": first["next"]}).json()
    assert [e["data"]["payload"]["n"] for e in rest["events"]] == [3, 4]
    assert api.get("/events", params={"after": rest["next"]}).json() == {"events": [], "next": rest["next"]}
    assert len(api.get("/events").json()["events"]) == 5
    assert_error(api.get("/events", params={"after": "banana"}), 400, "cursor")
    assert_error(api.get("/events", params={"after": "99999999999999999999999-1"}), 400, "range")
    assert_error(api.get("/events", params={"limit": 100000}), 422, "limit")


def test_queues_workers_metrics_and_health(api, conn):
    api.post("/jobs", json={"task": "echo"})
    api.post("/jobs", json={"task": "echo", "queue": "emails"})
    api.post("/jobs", json={"task": "fail", "max_retries": 0})
    run_job(conn, "ok")
    run_job(conn, error="boom")
    queues = {q["queue"]: q for q in api.get("/queues").json()["items"]}
    assert queues["default"]["counts"]["succeeded"] == 1 and queues["default"]["counts"]["dead"] == 1
    assert queues["emails"]["counts"]["pending"] == 1
    assert queues["emails"]["oldest_pending_age_seconds"] >= 0
    assert queues["default"]["oldest_pending_age_seconds"] is None
    assert api.get("/workers").json() == {"items": [], "next": None}

    metrics = api.get("/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert 'qforge_queue_depth{queue="emails",status="pending"} 1.0' in text
    assert "qforge_jobs_claimed_total 2.0" in text
    assert "qforge_jobs_dead_lettered_total 1.0" in text
    assert "qforge_jobs_succeeded_total 1.0" in text
    assert "qforge_claim_latency_seconds_count 2.0" in text
    # What the partitions made ahead can still take: an operator's alert before appends fail.
    gauge = re.search(r"^qforge_log_positions_left (\S+)$", text, re.MULTILINE)
    left = count(conn, "SELECT max(upper) - log_next_position() FROM log_partitions()")
    assert gauge is not None and float(gauge.group(1)) == left > 0
    api.post("/jobs", json={"task": "echo"})
    run_job(conn, "again")
    assert "qforge_jobs_claimed_total 3.0" in api.get("/metrics").text  # counters follow the log

    assert api.get("/healthz").json() == {"status": "ok"}


def test_healthz_is_503_when_the_database_is_down():
    url = "postgresql://nobody@/nothing?host=/nonexistent-qforge-socket-dir&connect_timeout=1"
    for client in serve(url):
        assert_error(client.get("/healthz"), 503, "database")
        assert_error(client.get("/jobs"), 503)


def test_unknown_routes_and_methods_are_json_errors(api):
    assert_error(api.get("/no/such/route"), 404)
    assert_error(api.delete("/jobs"), 405)


def test_dashboard_and_favicon_are_served(api):
    assert api.get("/favicon.ico").status_code in (200, 204)
    if (WEB_DIR / "index.html").is_file():
        page = api.get("/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]


def test_token_guards_every_route_but_healthz_and_the_dashboard(db_url):
    for client in serve(db_url, api_token="s3cret", stream_query_token=True):
        assert_error(client.get("/jobs"), 401, "Bearer")
        assert_error(client.post("/jobs", json={"task": "echo"}), 401)
        assert_error(client.get("/jobs", headers={"Authorization": "Bearer wrong"}), 401)
        assert_error(client.get("/events/stream", params={"token": "wrong"}), 401)
        assert_error(client.get("/jobs", params={"token": "s3cret"}), 401)  # only the stream takes ?token=
        assert client.get("/jobs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert client.get("/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert client.get("/healthz").status_code == 200
        if (WEB_DIR / "index.html").is_file():
            assert client.get("/").status_code == 200
        with client.stream("GET", "/events/stream", params={"token": "s3cret", "after": "0"}) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")


def test_slow_requests_do_not_hold_the_pool(api):
    """Many concurrent requests finish (the pool is shared, connections are returned)."""
    import concurrent.futures

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(32) as executor:
        codes = list(executor.map(lambda n: api.post("/jobs", json={"task": "echo"}).status_code, range(64)))
    assert codes == [201] * 64
    assert time.monotonic() - start < 30
