"""Workflows written as code, through real processes: `qforge api`, `qforge worker`, `qforge monitor`, the client.

Each guarantee of contract §7 is reached the way a user reaches it: started
over HTTP (or qforge.start in the caller's transaction), run by worker
processes that are killed with SIGKILL inside a step, between steps and inside
the function.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import psycopg
import pytest

import qforge
from cluster_procs import start_api
from code_workflow_support import code_env, dumps, journal_values, runs  # noqa: F401  (code_env: a fixture)
from test_worker_support import Processes, kill, procs, scalar, tasks_dir, wait_for  # noqa: F401

TASKS = "--tasks", "qf_code_tasks"


def workflow(client: qforge.Client, workflow_id) -> dict:
    return client.get_workflow(workflow_id).model_dump(mode="json")


def finished(client: qforge.Client, workflow_id) -> dict | None:
    view = workflow(client, workflow_id)
    return view if view["status"] in ("succeeded", "failed", "cancelled") else None


@pytest.fixture
def api(procs: Processes, code_env):
    """`qforge api` and a client of it: (base URL, client)."""
    _, base = start_api(procs, code_env["env"])
    with qforge.Client(base) as client:
        yield base, client


def wait_marker(marks: Path, name: str, timeout: float = 30) -> None:
    wait_for(lambda: (marks / f"{name}.here").exists(), timeout=timeout, message=f"the code to reach {name}")


def start_then_redeploy(procs: Processes, client: qforge.Client, env: dict, name: str):
    """Start `name` on a worker with the old code, wait for it to wait, then replace that worker by one
    with the new code (QF_VARIANT=2): a redeploy under a running workflow."""
    old_worker = procs.worker(*TASKS, env=env)
    created = client.start(name)
    wait_for(lambda: workflow(client, created.id)["waiting_on"], timeout=30, message="the old run to wait")
    kill(old_worker)
    procs.worker(*TASKS, env={**env, "QF_VARIANT": "2"})
    return created


def test_kill_9_inside_a_step_between_steps_and_inside_the_function_loses_nothing(
        conn: psycopg.Connection, procs: Processes, code_env, api):
    env = code_env["env"]
    base, client = api
    procs.monitor(env)
    created = client.start("cw_crashy", {"order": 7}, tags={"shop": "one"})
    assert created.code == "cw_crashy" and created.status == "running" and created.steps == []
    worker = procs.worker(*TASKS, env=env)
    wait_marker(code_env["marks"], "in-step")
    kill(worker)  # inside step cw_step (attempt 1)

    worker = procs.worker(*TASKS, env=env)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE workflow_id = %s AND step = 'cw_step#2'"
                                  " AND status = 'succeeded'", created.id) == 1,
             timeout=30, message="the second step to succeed")
    kill(worker)  # between steps: cw_step#2's result is recorded, the function has not gone on yet (or just)

    worker = procs.worker(*TASKS, env=env)
    wait_marker(code_env["marks"], "in-function")
    kill(worker)  # inside the function, in the activation after cw_step#2

    procs.worker(*TASKS, env=env)
    view = wait_for(lambda: finished(client, created.id), timeout=60, message="the workflow to finish")
    assert view["status"] == "succeeded", view
    result = view["result"]
    assert [result[k]["n"] for k in "abcd"] == [1, 2, 3, 4]
    assert [result[k]["step"] for k in "abcd"] == ["cw_step", "cw_step#2", "cw_step#3", "fourth"]
    # now/uuid/random were recorded once, by the run that first asked, and replayed after
    assert journal_values(conn, created.id) == [result["now"], result["uuid"], result["random"]]
    steps = {s["step"]: s for s in view["steps"]}
    assert list(steps) == ["cw_step", "cw_step#2", "cw_step#3", "fourth", "sleep"]
    assert {s["status"] for s in view["steps"]} == {"succeeded"}
    assert steps["fourth"]["depends_on"] == ["cw_step#2"] and steps["sleep"]["depends_on"] == ["cw_step#3", "fourth"]
    # only the step killed inside ran twice; a step whose result was recorded never ran again
    assert sorted(runs(code_env["runs"])) == [("cw_step", 1), ("cw_step", 2), ("cw_step#2", 1),
                                              ("cw_step#3", 1), ("fourth", 1)]
    assert scalar(conn, "SELECT count(*) FROM events WHERE workflow_id = %s AND type = 'Succeeded'"
                        " AND stream_id IN (SELECT id FROM jobs WHERE workflow_id = %s AND step_type = 'task')",
                  created.id, created.id) == 4
    # the run killed inside the function counted an attempt of its activation
    assert scalar(conn, "SELECT max(attempts) FROM jobs WHERE workflow_id = %s AND step_type = 'code'",
                  created.id) == 2
    tagged = httpx.get(f"{base}/executions", params={"tag": "shop:one"}).json()["items"]
    assert str(created.id) in [item["id"] for item in tagged]  # with its steps, which carry its tags


def test_a_changed_function_fails_nondeterministic_naming_the_step(conn, procs: Processes, code_env, api):
    base, client = api
    created = start_then_redeploy(procs, client, code_env["env"], "cw_variant")
    client.trigger(created.id, "go", {"ok": True})
    view = wait_for(lambda: finished(client, created.id), timeout=30, message="the workflow to fail")
    assert view["status"] == "failed"
    assert view["error"].startswith("nondeterministic: step 'ship'")
    assert "run('cw_step', step='ship')" in view["error"] and "run('echo', step='refund')" in view["error"]
    events = client.workflow_events(created.id)
    assert events[-1].data.reason == "nondeterministic"
    assert ("refund", 1) not in runs(code_env["runs"])


def test_the_model_through_the_api_waiting_holds_no_slot(conn, db_url, procs: Processes, code_env, api):
    """One worker with one slot and a monitor (for the timers) serve every check here."""
    env = code_env["env"]
    base, client = api
    procs.worker(*TASKS, "--concurrency", "1", env=env)
    procs.monitor(env)
    waiting = [client.start("cw_waits", n) for n in range(3)]
    for created in waiting:
        wait_for(lambda: workflow(client, created.id)["waiting_on"], timeout=30, message="each to wait")
    job = client.enqueue("echo", {"free": True})  # the one slot is free while three functions wait
    assert client.wait(job.id, timeout=30) == {"free": True}
    client.trigger(waiting[1].id, "approve", {"yes": 1})
    view = wait_for(lambda: finished(client, waiting[1].id), timeout=30, message="the triggered one to finish")
    assert view["result"] == {"answer": {"yes": 1}, "after": {"n": 1, "step": "cw_step"}}
    assert [s["step"] for s in view["steps"]] == ["approve", "cw_step"]
    assert workflow(client, waiting[0].id)["status"] == "running"

    unknown = client.start("no_such_workflow")
    view = wait_for(lambda: finished(client, unknown.id), timeout=30, message="the unknown one to fail")
    assert view["status"] == "failed" and view["error"].startswith("unknown_workflow: ")
    with pytest.raises(qforge.Invalid):
        client.start("bad name!")
    response = httpx.post(f"{base}/workflows", json={"code": "x", "steps": []})
    assert response.status_code == 422 and response.json()["details"][0]["field"] == "steps"
    check_step_failed_is_catchable_and_uncaught_fails_the_workflow(client)
    check_start_in_the_callers_transaction_and_async_functions(client, base, db_url)


def check_step_failed_is_catchable_and_uncaught_fails_the_workflow(client: qforge.Client) -> None:
    caught = client.start("cw_catches")
    uncaught = client.start("cw_uncaught")
    view = wait_for(lambda: finished(client, caught.id), timeout=30, message="cw_catches to finish")
    assert view["status"] == "succeeded"
    assert view["result"] == {"caught": "step doomed fails", "attempts": 2, "step": "doomed"}
    view = wait_for(lambda: finished(client, uncaught.id), timeout=30, message="cw_uncaught to finish")
    assert view["status"] == "failed" and view["error"].startswith("step_failed: step 'cw_step' dead")
    failed = client.workflow_events(uncaught.id)[-1]
    assert failed.type == "WorkflowFailed" and failed.data.reason == "step_failed"


def check_start_in_the_callers_transaction_and_async_functions(client: qforge.Client, base: str, db_url: str) -> None:
    with psycopg.connect(db_url) as app:
        rolled_back = qforge.start(app, "cw_async", {"a": 1})
        app.rollback()
        kept = qforge.start(app, "cw_async", {"a": 10}, idempotency_key="k1")
        app.commit()
        assert qforge.start(app, "cw_async", {"a": 10}, idempotency_key="k1") == kept
        app.commit()
    view = wait_for(lambda: finished(client, kept), timeout=30, message="the async workflow to finish")
    assert view["status"] == "succeeded" and view["code"] == "cw_async" and view["input"] == {"a": 10}
    assert view["result"]["first"] == 11 and view["result"]["both"] == [12, {"x": 11}]
    assert [s["step"] for s in view["steps"]] == ["add", "add#2", "echo", "sleep"]
    assert httpx.get(f"{base}/workflows/{rolled_back}").status_code == 404
