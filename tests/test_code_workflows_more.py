"""Code workflows: ctx.child (code and stored definitions; cancelling the parent cancels the child) and
ctx.version under a redeploy, through real api, worker and monitor processes."""

from __future__ import annotations

import httpx

import qforge
from cluster_procs import start_api

from code_workflow_support import code_env  # noqa: F401  (a fixture)
from test_code_workflows import TASKS, api, finished, start_then_redeploy, workflow  # noqa: F401  (api: a fixture)
from test_worker_support import Processes, procs, tasks_dir, wait_for  # noqa: F401

KID_DEFINITION = {"result": {"step": "sum"}, "steps": [{"step": "sum", "task": "echo"}]}


def test_children_of_code_and_stored_definitions_and_cancel_reaches_them(conn, procs: Processes, code_env, api):
    env = code_env["env"]
    base, client = api
    assert httpx.put(f"{base}/definitions/kid_def", json=KID_DEFINITION).status_code in (200, 201)
    procs.worker(*TASKS, env=env)
    procs.monitor(env)
    created = client.start("cw_parent")
    view = wait_for(lambda: finished(client, created.id), timeout=60, message="the parent to finish")
    assert view["status"] == "succeeded", view
    assert view["result"]["code"] == 5
    assert view["result"]["stored"]["inputs"] == {"v": 1}  # a definition's root steps get its inputs
    assert "child workflow" in view["result"]["failed"] and "step_failed" in view["result"]["failed"]
    steps = {s["step"]: s for s in view["steps"]}
    assert [s["type"] for s in view["steps"]] == ["workflow"] * 3
    assert steps["cw_kid"]["child_workflow_id"] and steps["kid_def"]["child_workflow_id"]
    kid = workflow(client, steps["cw_kid"]["child_workflow_id"])
    assert kid["code"] == "cw_kid" and kid["parent"]["step"] == "cw_kid" and kid["result"] == 5

    waiting = client.start("cw_parent_waits")
    wait_for(lambda: workflow(client, waiting.id)["steps"], timeout=30, message="the child to start")
    child_id = workflow(client, waiting.id)["steps"][0]["child_workflow_id"]
    wait_for(lambda: workflow(client, child_id)["waiting_on"], timeout=30, message="the child to wait")
    client.cancel_workflow(waiting.id)
    assert workflow(client, child_id)["status"] == "cancelled"


def test_version_keeps_a_running_workflow_on_its_branch_after_a_redeploy(conn, procs: Processes, code_env, api):
    base, client = api
    before = start_then_redeploy(procs, client, code_env["env"], "cw_versioned")  # new code: audit first
    after = client.start("cw_versioned")
    wait_for(lambda: workflow(client, after.id)["waiting_on"], timeout=30, message="the new run to wait")
    for created in (before, after):
        client.trigger(created.id, "go")
    old = wait_for(lambda: finished(client, before.id), timeout=30, message="the old run to finish")
    new = wait_for(lambda: finished(client, after.id), timeout=30, message="the new run to finish")
    assert (old["status"], old["result"]) == ("succeeded", {"new": False})
    assert (new["status"], new["result"]) == ("succeeded", {"new": True})
    assert [s["step"] for s in old["steps"]] == ["one", "go"]
    assert [s["step"] for s in new["steps"]] == ["audit", "one", "go"]


def test_steps_a_function_starts_count_toward_max_workflow_jobs(conn, procs: Processes, code_env, tasks_dir):
    """A loop in the function cannot write more jobs than QFORGE_MAX_WORKFLOW_JOBS: the run that asks
    for too many steps fails the workflow (reason too_many_jobs) before any of them is written."""
    env = {**code_env["env"], "QFORGE_MAX_WORKFLOW_JOBS": "6"}
    _, base = start_api(procs, env)
    procs.worker(*TASKS, env=env)
    with qforge.Client(base) as client:
        within = client.start("cw_many", {"n": 3})  # its first run and 3 steps, then a second run: 5 jobs
        over = client.start("cw_many", {"n": 10})  # its first run and 10 steps: 11 jobs
        view = wait_for(lambda: finished(client, within.id), timeout=60, message="the workflow within the cap")
        assert view["status"] == "succeeded" and len(view["result"]) == 3, view
        view = wait_for(lambda: finished(client, over.id), timeout=60, message="the workflow over the cap")
        assert view["status"] == "failed" and "QFORGE_MAX_WORKFLOW_JOBS (6)" in view["error"], view
        assert client.workflow_events(over.id)[-1].data.reason == "too_many_jobs"
        assert view["steps"] == []  # none of the ten was written
