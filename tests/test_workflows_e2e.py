"""Workflows end to end with real `qforge worker` and `qforge monitor` processes."""

from __future__ import annotations

from datetime import datetime

from psycopg.rows import dict_row

from qforge.workflows import engine as wf
from test_worker_support import Processes, procs, registry, tasks_dir, wait_for  # noqa: F401 (fixtures)


def submit(conn, steps, name="e2e") -> object:
    return wf.submit(conn, wf.WorkflowSpec.model_validate({"name": name, "steps": steps}))[0]


def workflow_status(conn, workflow_id) -> str:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT status FROM workflows WHERE id = %s", (workflow_id,))
        return cur.fetchone()["status"]


def steps(conn, workflow_id) -> dict[str, dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM jobs WHERE workflow_id = %s", (workflow_id,))
        return {row["step"]: row for row in cur.fetchall()}


def finished(conn, workflow_id) -> str | None:
    status = workflow_status(conn, workflow_id)
    return None if status == "running" else status


def claimed_and_done(conn, workflow_id) -> dict[str, tuple[datetime, datetime]]:
    """Per step: when its (last) attempt was claimed and when it succeeded."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            "SELECT j.step, max(e.occurred_at) FILTER (WHERE e.type = 'Claimed') AS started,"
            "       max(e.occurred_at) FILTER (WHERE e.type = 'Succeeded') AS done"
            "  FROM events e JOIN jobs j ON j.id = e.stream_id"
            " WHERE e.workflow_id = %s GROUP BY j.step", (workflow_id,))
        return {row["step"]: (row["started"], row["done"]) for row in cur.fetchall()}


def test_ci_dag_runs_in_dependency_order_with_test_and_lint_overlapping(conn, procs: Processes):
    workflow_id = submit(conn, [
        {"step": "build", "task": "echo"},
        {"step": "test", "task": "slow", "payload": {"seconds": 0.6}, "depends_on": ["build"]},
        {"step": "lint", "task": "slow", "payload": {"seconds": 0.6}, "depends_on": ["build"]},
        {"step": "deploy", "task": "echo", "depends_on": ["test", "lint"]},
    ])
    procs.worker("--concurrency", "2")
    assert wait_for(lambda: finished(conn, workflow_id), timeout=20,
                    message="the CI workflow to finish") == "succeeded"
    times = claimed_and_done(conn, workflow_id)
    assert times["test"][0] >= times["build"][1] and times["lint"][0] >= times["build"][1]
    assert times["deploy"][0] >= max(times["test"][1], times["lint"][1])
    # two free slots: test and lint ran at the same time
    assert times["test"][0] < times["lint"][1] and times["lint"][0] < times["test"][1]


def test_branch_handler_and_trigger_end_to_end(conn, procs: Processes):
    procs.worker("--concurrency", "4")
    procs.monitor()
    branch = [
        {"step": "decide", "task": "echo", "payload": {"X": "doB"}},
        {"step": "B", "task": "fail", "max_retries": 0, "on_failure": "cleanup",
         "when": {"step": "decide", "path": "X", "equals": "doB"}},
        {"step": "C", "task": "echo", "when": {"step": "decide", "path": "X", "equals": "doC"}},
        {"step": "cleanup", "task": "echo"},
        {"step": "approve", "type": "wait_for_trigger", "depends_on": ["decide"]},
        {"step": "ship", "task": "echo", "depends_on": ["approve"]},
    ]
    workflow_id = submit(conn, branch)
    wait_for(lambda: steps(conn, workflow_id)["approve"]["status"] == "waiting", timeout=15,
             message="the approval step to wait")
    wait_for(lambda: steps(conn, workflow_id)["cleanup"]["status"] == "succeeded", timeout=15,
             message="the failure handler to run")
    state = steps(conn, workflow_id)
    assert state["B"]["status"] == "dead" and state["C"]["status"] == "skipped"
    assert state["cleanup"]["result"]["failed_step"] == "B"
    assert workflow_status(conn, workflow_id) == "running"
    wf.trigger(conn, workflow_id, "approve", {"by": "ops"})
    assert wait_for(lambda: finished(conn, workflow_id), timeout=15,
                    message="the workflow to finish") == "succeeded"
    assert steps(conn, workflow_id)["ship"]["result"]["inputs"] == {"approve": {"by": "ops"}}


def test_sleep_step_does_not_hold_a_worker_slot(conn, procs: Processes):
    procs.worker("--concurrency", "1", "--name", "single")
    procs.monitor()
    wait_for(lambda: registry(conn, "single"), timeout=15, message="the worker to register")
    workflow_id = submit(conn, [{"step": "nap", "type": "sleep", "seconds": 3},
                                {"step": "after", "task": "echo", "depends_on": ["nap"]}])
    other = submit(conn, [{"step": "meanwhile", "task": "echo"}], name="other")
    assert wait_for(lambda: finished(conn, workflow_id), timeout=20,
                    message="the sleep to end") == "succeeded"
    assert finished(conn, other) == "succeeded"
    nap = steps(conn, workflow_id)["nap"]
    meanwhile = steps(conn, other)["meanwhile"]
    assert (nap["finished_at"] - nap["started_at"]).total_seconds() >= 3
    # the only slot ran other work while the sleep was waiting
    assert nap["started_at"] <= meanwhile["finished_at"] < nap["finished_at"]
    assert claimed_and_done(conn, workflow_id)["after"][0] >= nap["finished_at"]


def test_cancel_stops_a_running_step_and_ends_the_workflow(conn, procs: Processes):
    procs.worker("--concurrency", "2")
    workflow_id = submit(conn, [{"step": "long", "task": "slow", "payload": {"seconds": 30}},
                                {"step": "next", "task": "echo", "depends_on": ["long"]}])
    wait_for(lambda: steps(conn, workflow_id)["long"]["status"] == "running", timeout=10,
             message="the long step to start")
    wf.cancel(conn, workflow_id)
    assert workflow_status(conn, workflow_id) == "cancelled"
    assert {s["status"] for s in steps(conn, workflow_id).values()} == {"cancelled"}
    long_id = steps(conn, workflow_id)["long"]["id"]
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) AS n FROM events WHERE stream_id = %s AND type = 'Succeeded'",
                    (long_id,))
        assert cur.fetchone()["n"] == 0


def test_shell_dag_a_then_b_c_then_d(conn, procs: Processes):
    procs.worker("--concurrency", "4", "--allow-shell")
    workflow_id = submit(conn, [
        {"step": "A", "task": "shell", "payload": {"command": "echo hello"}},
        {"step": "B", "task": "shell", "payload": {"command": "ls /"}, "depends_on": ["A"]},
        {"step": "C", "task": "shell", "payload": {"command": "pwd"}, "depends_on": ["A"]},
        {"step": "D", "task": "shell", "payload": {"command": "date"}, "depends_on": ["B", "C"]},
    ])
    assert wait_for(lambda: finished(conn, workflow_id), timeout=20,
                    message="the shell DAG to finish") == "succeeded"
    state = steps(conn, workflow_id)
    assert state["A"]["result"]["stdout"].strip() == "hello"
    assert all(s["result"]["exit_code"] == 0 for s in state.values())
