"""Code workflows under the operations graph workflows have: cancel, deadline, resume, the stream,
replay --verify without the function's code, audit proofs (real api, worker and monitor processes)."""

from __future__ import annotations

import os
import subprocess

import httpx

import qforge
from code_workflow_support import code_env, runs  # noqa: F401  (code_env: a fixture)
from test_code_workflows import TASKS, api, finished, workflow  # noqa: F401  (api: a fixture)
from test_worker_support import QFORGE, Processes, procs, scalar, tasks_dir, wait_for  # noqa: F401


def test_cancel_deadline_and_resume_from_the_failed_step(conn, procs: Processes, code_env, api, tmp_path):
    env = code_env["env"]
    base, client = api
    procs.worker(*TASKS, env=env)
    procs.monitor(env)
    long = client.start("cw_long")
    wait_for(lambda: any(s["step"] == "long" and s["status"] == "running" for s in workflow(client, long.id)["steps"]),
             timeout=30, message="the long step to run")
    view = client.cancel_workflow(long.id).model_dump(mode="json")
    assert view["status"] == "cancelled" and [s["status"] for s in view["steps"]] == ["cancelled"]
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'running'") == 0, timeout=30,
             message="the running step to stop")  # its worker learns it at the next heartbeat

    late = client.start("cw_waits", 1, deadline_seconds=1)
    view = wait_for(lambda: finished(client, late.id), timeout=30, message="the deadline")
    assert view["status"] == "failed" and view["error"].startswith("deadline")
    assert [s["status"] for s in view["steps"]] == ["skipped"]

    fixed = tmp_path / "fixed"
    broken = client.start("cw_fixable", {"fixed": str(fixed)})
    view = wait_for(lambda: finished(client, broken.id), timeout=30, message="the step to fail")
    assert view["status"] == "failed" and [s["status"] for s in view["steps"]] == ["succeeded", "dead"]
    fixed.write_text("yes")
    response = httpx.post(f"{base}/workflows/{broken.id}/resume")
    assert response.status_code == 200, response.text
    view = wait_for(lambda: finished(client, broken.id), timeout=30, message="the resumed workflow")
    assert view["status"] == "succeeded" and view["result"]["second"] == {"n": 2, "step": "second"}
    # the step that had succeeded kept its result and did not run again
    assert [r for r in runs(code_env["runs"]) if r[0] == "first"] == [("first", 1)]
    assert httpx.post(f"{base}/workflows/{broken.id}/resume").status_code == 409


def test_stream_replay_without_the_code_and_proofs(conn, db_url, procs: Processes, code_env, api):
    env = code_env["env"]
    base, client = api
    procs.worker(*TASKS, env=env)
    procs.monitor(env)
    created = client.start("cw_async", {"a": 1}, tags={"team": "red"})
    seen = []
    for event in client.events(after="0", workflow_id=str(created.id)):
        seen.append(event.type)
        if event.type in ("WorkflowSucceeded", "WorkflowFailed"):
            break
    assert seen[0] == "WorkflowSubmitted" and seen[-1] == "WorkflowSucceeded"
    assert seen.count("Enqueued") == 4 + 4  # 4 steps and 4 runs of the function

    # replay rebuilds every projection from the log alone: no task module on its path
    plain_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    replay = subprocess.run([str(QFORGE), "replay", "--verify", "--database-url", db_url], env=plain_env,
                            capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0, replay.stdout + replay.stderr

    subprocess.run([str(QFORGE), "audit", "checkpoint", "--database-url", db_url], env=plain_env, check=True,
                   capture_output=True, timeout=60)
    proof = httpx.get(f"{base}/workflows/{created.id}/proof").json()
    assert proof["status"]["verified"] and proof["status"]["problems"] == [], proof["status"]
    assert proof["status"]["covered"] == len(proof["events"])
    kinds = {e["type"] for e in proof["events"]}
    assert {"WorkflowSubmitted", "Claimed", "Succeeded", "WorkflowSucceeded"} <= kinds
