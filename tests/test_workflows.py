"""Workflows through the commands: order, branches, handlers, waits, cancel, cascades, races."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest
from psycopg.rows import dict_row

from qforge.workflows import engine as wf
from qforge.commands.claim import claim
from qforge.commands.errors import Conflict, Invalid
from qforge.commands.report import Report, complete, fail
from qforge.db import connect
from tests.factories import count


def submit(conn, steps, **extra):
    spec = wf.WorkflowSpec.model_validate({"name": "t", "steps": steps, **extra})
    return wf.submit(conn, spec)[0]


def steps_of(conn, workflow_id) -> dict[str, dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM jobs WHERE workflow_id = %s", (workflow_id,))
        return {row["step"]: row for row in cur.fetchall()}


def status_of(conn, workflow_id) -> str:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT status FROM workflows WHERE id = %s", (workflow_id,))
        return cur.fetchone()["status"]


def run_ready(conn, outputs=None, failures=(), limit=100, now=None) -> list[str]:
    """Act as a worker: claim what is ready, succeed or fail it; returns the steps run."""
    jobs = claim(conn, ["default"], limit, "w", now=now)
    done = [j for j in jobs if j.step not in failures]
    complete(conn, [Report(j.id, j.attempt, result=(outputs or {}).get(j.step, {"step": j.step}),
                           workflow_id=j.workflow_id) for j in done],
             actor="w", workflow_ids_known=True)
    fail(conn, [Report(j.id, j.attempt, error=f"{j.step} broke", workflow_id=j.workflow_id)
                for j in jobs if j.step in failures], actor="w", workflow_ids_known=True)
    return sorted(j.step for j in jobs)


CI = [{"step": "build", "task": "echo"},
      {"step": "test", "task": "echo", "depends_on": ["build"]},
      {"step": "lint", "task": "echo", "depends_on": ["build"]},
      {"step": "deploy", "task": "echo", "depends_on": ["test", "lint"]}]


def test_ci_dag_runs_in_dependency_order_and_passes_outputs(conn):
    workflow_id = submit(conn, CI)
    assert {s: r["status"] for s, r in steps_of(conn, workflow_id).items()} == {
        "build": "pending", "test": "blocked", "lint": "blocked", "deploy": "blocked"}
    assert run_ready(conn) == ["build"]
    assert run_ready(conn) == ["lint", "test"]
    assert run_ready(conn) == ["deploy"]
    assert run_ready(conn) == []
    assert status_of(conn, workflow_id) == "succeeded"
    deploy = steps_of(conn, workflow_id)["deploy"]
    assert deploy["payload"]["inputs"] == {"test": {"step": "test"}, "lint": {"step": "lint"}}


BRANCH = [{"step": "A", "task": "echo"},
          {"step": "B", "task": "echo", "when": {"step": "A", "path": "X", "equals": "doB"},
           "on_failure": "handler"},
          {"step": "C", "task": "echo", "when": {"step": "A", "path": "X", "equals": "doC"}},
          {"step": "handler", "task": "echo"},
          {"step": "approve", "type": "wait_for_trigger", "depends_on": ["B"]}]


def test_branch_runs_only_the_matching_side(conn):
    workflow_id = submit(conn, BRANCH)
    run_ready(conn, outputs={"A": {"X": "doC"}})
    steps = steps_of(conn, workflow_id)
    assert steps["B"]["status"] == "skipped" and steps["C"]["status"] == "pending"
    assert steps["approve"]["status"] == "skipped"
    run_ready(conn)
    steps = steps_of(conn, workflow_id)
    assert steps["handler"]["status"] == "skipped"
    assert status_of(conn, workflow_id) == "succeeded"


def test_trigger_completes_a_waiting_step_with_its_payload(conn):
    workflow_id = submit(conn, BRANCH)
    run_ready(conn, outputs={"A": {"X": "doB"}})
    with pytest.raises(Conflict):
        wf.trigger(conn, workflow_id, "approve", {"ok": True})  # still blocked
    run_ready(conn)
    assert steps_of(conn, workflow_id)["approve"]["status"] == "waiting"
    wf.trigger(conn, workflow_id, "approve", {"approved_by": "ana"})
    steps = steps_of(conn, workflow_id)
    assert steps["approve"]["status"] == "succeeded"
    assert steps["approve"]["result"] == {"approved_by": "ana"}
    assert status_of(conn, workflow_id) == "succeeded"
    with pytest.raises(Conflict):
        wf.trigger(conn, workflow_id, "approve", {})


def test_failure_handler_runs_with_the_error_and_rescues_the_workflow(conn):
    workflow_id = submit(conn, [{**s, "max_retries": 0} if s["step"] == "B" else s for s in BRANCH])
    run_ready(conn, outputs={"A": {"X": "doB"}})
    run_ready(conn, failures=("B",))
    steps = steps_of(conn, workflow_id)
    assert steps["B"]["status"] == "dead"
    assert steps["approve"]["status"] == "skipped"
    assert steps["handler"]["status"] == "pending"
    assert steps["handler"]["payload"]["error"] == "B broke"
    assert steps["handler"]["payload"]["failed_step"] == "B"
    run_ready(conn)
    assert status_of(conn, workflow_id) == "succeeded"


def test_failure_cascade_skips_exactly_the_descendants_that_cannot_run(conn):
    workflow_id = submit(conn, [
        {"step": "a", "task": "echo"},
        {"step": "b", "task": "echo", "depends_on": ["a"], "max_retries": 0},
        {"step": "c", "task": "echo", "depends_on": ["a"]},
        {"step": "d", "task": "echo", "depends_on": ["b"]},
        {"step": "e", "task": "echo", "depends_on": ["d", "c"]},
        {"step": "f", "task": "echo", "depends_on": ["c"]},
    ])
    run_ready(conn)
    run_ready(conn, failures=("b",))
    steps = steps_of(conn, workflow_id)
    assert {s: r["status"] for s, r in steps.items()} == {
        "a": "succeeded", "b": "dead", "c": "succeeded", "d": "skipped", "e": "skipped",
        "f": "pending"}
    assert status_of(conn, workflow_id) == "running"
    run_ready(conn)
    assert status_of(conn, workflow_id) == "failed"


def test_sleep_step_completes_by_timer_without_a_worker(conn):
    now = datetime.now(timezone.utc)
    workflow_id = submit(conn, [{"step": "nap", "type": "sleep", "seconds": 30},
                                {"step": "after", "task": "echo", "depends_on": ["nap"]}])
    assert steps_of(conn, workflow_id)["nap"]["status"] == "waiting"
    assert claim(conn, ["default"], 10, "w") == []
    assert wf.fire_timers(conn, now=now + timedelta(seconds=5)) == 0
    assert wf.fire_timers(conn, now=now + timedelta(seconds=31)) == 1
    assert run_ready(conn, now=now + timedelta(seconds=31)) == ["after"]
    assert status_of(conn, workflow_id) == "succeeded"


def test_trigger_wait_times_out_and_fails(conn):
    now = datetime.now(timezone.utc)
    workflow_id = submit(conn, [{"step": "gate", "type": "wait_for_trigger", "timeout_seconds": 10}])
    wf.fire_timers(conn, now=now + timedelta(seconds=11))
    assert steps_of(conn, workflow_id)["gate"]["status"] == "dead"
    assert status_of(conn, workflow_id) == "failed"


def test_cancel_cancels_open_steps_and_the_workflow(conn):
    workflow_id = submit(conn, CI)
    build = claim(conn, ["default"], 1, "w")[0]
    wf.cancel(conn, workflow_id)
    assert status_of(conn, workflow_id) == "cancelled"
    assert {r["status"] for r in steps_of(conn, workflow_id).values()} == {"cancelled"}
    late = complete(conn, [Report(build.id, build.attempt, workflow_id=workflow_id)], actor="w",
                    workflow_ids_known=True)
    assert late.rejected == [build.id]
    with pytest.raises(Conflict):
        wf.cancel(conn, workflow_id)


def test_invalid_workflow_is_refused_with_every_problem_and_nothing_stored(conn):
    with pytest.raises(Invalid) as caught:
        submit(conn, [{"step": "a", "task": "echo", "depends_on": ["b"]},
                      {"step": "b", "task": "echo", "depends_on": ["a"]},
                      {"step": "c", "task": "echo", "depends_on": ["zzz"]}])
    assert len(caught.value.details) == 2
    assert count(conn, "SELECT count(*) FROM events") == 0


def test_resubmitting_with_an_idempotency_key_returns_the_same_workflow(conn):
    first = submit(conn, CI, idempotency_key="deploy-7")
    assert submit(conn, CI, idempotency_key="deploy-7") == first
    assert count(conn, "SELECT count(*) FROM workflows") == 1


def test_two_dependencies_finishing_at_once_unblock_the_dependent_exactly_once(conn, db_url):
    for _ in range(10):
        workflow_id = submit(conn, [{"step": "left", "task": "echo"}, {"step": "right", "task": "echo"},
                                    {"step": "join", "task": "echo", "depends_on": ["left", "right"]}])
        jobs = claim(conn, ["default"], 2, "w")
        barrier = threading.Barrier(2)

        def finish(job):
            with connect(db_url, autocommit=True) as own:
                barrier.wait()
                complete(own, [Report(job.id, job.attempt, workflow_id=job.workflow_id)],
                         actor="w", workflow_ids_known=True)

        threads = [threading.Thread(target=finish, args=(job,)) for job in jobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        join = steps_of(conn, workflow_id)["join"]
        assert join["status"] == "pending"
        assert count(conn, "SELECT count(*) FROM events WHERE stream_id = %s AND type = 'StepUnblocked'",
                     join["id"]) == 1
        run_ready(conn)
        assert status_of(conn, workflow_id) == "succeeded"
