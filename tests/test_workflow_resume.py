"""Resume, results and deadlines through the commands (issue 15): what runs again, what never does."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from psycopg.rows import dict_row

from qforge.workflows import dag
from qforge.workflows import engine as wf
from qforge.commands.claim import claim
from qforge.commands.errors import Conflict, Invalid
from qforge.commands.manage import retry_job
from qforge.workflows.resume import resume, steps_to_reopen
from qforge.events import store
from qforge.projections.workflows import get_workflow
from tests.test_workflows import run_ready, status_of, steps_of, submit

# a -> b -> c, with d beside them on a: b is the one that breaks
CHAIN = [{"step": "a", "task": "echo", "max_retries": 0},
         {"step": "b", "task": "echo", "depends_on": ["a"], "max_retries": 0},
         {"step": "c", "task": "echo", "depends_on": ["b"], "max_retries": 0},
         {"step": "d", "task": "echo", "depends_on": ["a"], "max_retries": 0}]


def statuses(conn, workflow_id) -> dict[str, str]:
    return {name: row["status"] for name, row in steps_of(conn, workflow_id).items()}


def claims_per_step(conn, workflow_id) -> dict[str, int]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT j.step, count(*) FILTER (WHERE e.type = 'Claimed') AS n"
                    "  FROM events e JOIN jobs j ON j.id = e.stream_id"
                    " WHERE e.workflow_id = %s GROUP BY j.step", (workflow_id,))
        return {row["step"]: row["n"] for row in cur.fetchall()}


def failed_chain(conn):
    workflow_id = submit(conn, CHAIN)
    assert run_ready(conn) == ["a"]
    assert run_ready(conn, failures={"b"}) == ["b", "d"]
    assert status_of(conn, workflow_id) == "failed"
    assert statuses(conn, workflow_id) == {"a": "succeeded", "b": "dead", "c": "skipped", "d": "succeeded"}
    return workflow_id


def test_resume_reruns_dead_and_skipped_steps_and_never_a_succeeded_one(conn):
    workflow_id = failed_chain(conn)
    assert resume(conn, workflow_id) == ["b", "c"]
    assert status_of(conn, workflow_id) == "running"
    assert statuses(conn, workflow_id) == {"a": "succeeded", "b": "pending", "c": "blocked", "d": "succeeded"}
    b = steps_of(conn, workflow_id)["b"]
    assert b["payload"]["inputs"] == {"a": {"step": "a"}}  # a's output, kept from the first run
    assert run_ready(conn) == ["b"]  # a fresh retry budget: max_retries 0 still allows this attempt
    assert run_ready(conn) == ["c"]
    assert status_of(conn, workflow_id) == "succeeded"
    assert claims_per_step(conn, workflow_id) == {"a": 1, "b": 2, "c": 1, "d": 1}
    types = [e.type for e in store.read_workflow(conn, workflow_id) if e.stream_id == workflow_id]
    assert types == ["WorkflowSubmitted", "WorkflowFailed", "WorkflowResumed", "WorkflowSucceeded"]


def test_resume_of_a_running_or_succeeded_workflow_is_a_conflict(conn):
    workflow_id = submit(conn, CHAIN)
    with pytest.raises(Conflict):
        resume(conn, workflow_id)
    run_ready(conn), run_ready(conn), run_ready(conn)
    assert status_of(conn, workflow_id) == "succeeded"
    with pytest.raises(Conflict):
        resume(conn, workflow_id)
    assert claims_per_step(conn, workflow_id) == {"a": 1, "b": 1, "c": 1, "d": 1}


def test_resume_of_a_cancelled_workflow_runs_the_cancelled_steps(conn):
    workflow_id = submit(conn, CHAIN)
    run_ready(conn)
    wf.cancel(conn, workflow_id)
    assert statuses(conn, workflow_id) == {"a": "succeeded", "b": "cancelled", "c": "cancelled", "d": "cancelled"}
    assert resume(conn, workflow_id) == ["b", "c", "d"]
    assert sorted(run_ready(conn)) == ["b", "d"]
    assert run_ready(conn) == ["c"]
    assert status_of(conn, workflow_id) == "succeeded"


def test_a_step_that_dies_again_fails_the_resumed_workflow_again(conn):
    workflow_id = failed_chain(conn)
    resume(conn, workflow_id)
    run_ready(conn, failures={"b"})
    assert status_of(conn, workflow_id) == "failed"
    assert statuses(conn, workflow_id)["c"] == "skipped"


def test_retry_of_a_dead_step_reopens_its_failed_workflow(conn):
    workflow_id = failed_chain(conn)
    retry_job(conn, steps_of(conn, workflow_id)["b"]["id"])
    assert status_of(conn, workflow_id) == "running"
    assert statuses(conn, workflow_id) == {"a": "succeeded", "b": "pending", "c": "blocked", "d": "succeeded"}
    run_ready(conn), run_ready(conn)
    assert status_of(conn, workflow_id) == "succeeded"
    resumed = [e for e in store.read_workflow(conn, workflow_id) if e.type == "WorkflowResumed"]
    assert [e.data["reason"] for e in resumed] == ["retry of step 'b'"]


def test_retry_of_a_succeeded_or_skipped_step_is_a_conflict(conn):
    workflow_id = failed_chain(conn)
    rows = steps_of(conn, workflow_id)
    for step in ("a", "c"):
        with pytest.raises(Conflict):
            retry_job(conn, rows[step]["id"])
    assert status_of(conn, workflow_id) == "failed"


def test_steps_to_reopen_follows_dependents_and_handlers_only_from_the_seeds():
    defs = [dag.StepDef("a"), dag.StepDef("b", depends_on=("a",), on_failure="h"),
            dag.StepDef("c", depends_on=("b",)), dag.StepDef("h"), dag.StepDef("x"),
            dag.StepDef("y", depends_on=("x",))]
    status = {"a": "succeeded", "b": "dead", "c": "skipped", "h": "dead", "x": "dead", "y": "skipped"}
    states = {d.name: dag.StepState(d, status[d.name]) for d in defs}
    assert steps_to_reopen(states, {"b"}) == ["b", "c", "h"]
    assert steps_to_reopen(states, {"a"}) == []
    assert steps_to_reopen(states, set(states)) == ["b", "c", "h", "x", "y"]


# --------------------------------------------------------------------------- results


def test_a_succeeded_workflow_carries_the_result_it_names(conn):
    workflow_id = submit(conn, CHAIN[:2], result={"step": "b", "path": "report.total"})
    run_ready(conn)
    run_ready(conn, outputs={"b": {"report": {"total": 42}}})
    view = get_workflow(conn, workflow_id)
    assert (view["status"], view["result"]) == ("succeeded", 42)
    succeeded = [e for e in store.read_workflow(conn, workflow_id) if e.type == "WorkflowSucceeded"]
    assert succeeded[0].data == {"result": 42}


def test_result_naming_an_unknown_step_is_invalid_with_the_other_problems(conn):
    with pytest.raises(Invalid) as caught:
        submit(conn, [{"step": "a", "task": "echo", "depends_on": ["zz"]}], result={"step": "nope"})
    assert any("result names unknown step 'nope'" in p for p in caught.value.details)
    assert any("unknown step 'zz'" in p for p in caught.value.details)
    assert conn.execute("SELECT count(*) AS n FROM events").fetchone()["n"] == 0


# --------------------------------------------------------------------------- deadlines


def test_a_workflow_past_its_deadline_stops_running_steps_skips_the_rest_and_fails(conn):
    start = datetime.now(timezone.utc)
    workflow_id = submit(conn, CHAIN, deadline_seconds=30)
    claim(conn, ["default"], 10, "w")  # a runs
    assert wf.fire_deadlines(conn, now=start + timedelta(seconds=20)) == 0
    assert wf.fire_deadlines(conn, now=start + timedelta(seconds=31)) == 1
    assert status_of(conn, workflow_id) == "failed"
    assert statuses(conn, workflow_id) == {"a": "cancelled", "b": "skipped", "c": "skipped", "d": "skipped"}
    failed = [e for e in store.read_workflow(conn, workflow_id) if e.type == "WorkflowFailed"]
    assert failed[0].data["reason"] == "deadline"
    assert get_workflow(conn, workflow_id)["error"].startswith("deadline")
    # resumed, it gets a new deadline and runs every step
    later = start + timedelta(seconds=40)
    resume(conn, workflow_id, now=later)
    assert get_workflow(conn, workflow_id)["deadline_at"] == later + timedelta(seconds=30)
    assert wf.fire_deadlines(conn, now=later + timedelta(seconds=29)) == 0
    run_ready(conn, now=later), run_ready(conn, now=later), run_ready(conn, now=later)
    assert status_of(conn, workflow_id) == "succeeded"
