"""The transition constructors (qforge.events.transitions): stream versions handed out, the state table checked as they build."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qforge.events import states
from qforge.events import transitions as tr
from qforge.events import types as ev
from qforge.events.states import (BLOCKED, CANCELLED, DEAD, FAILED, PENDING, RUNNING, SKIPPED, SUCCEEDED,
                                  WAITING, IllegalTransition)

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
WORKFLOW_ID = uuid.uuid4()


def job(status: str, version: int = 3, attempts: int = 1) -> dict:
    return {"id": uuid.uuid4(), "version": version, "status": status, "tags": {"team": "a"},
            "workflow_id": WORKFLOW_ID, "attempts": attempts}


def workflow(status: str, version: int = 1) -> dict:
    return {"id": WORKFLOW_ID, "version": version, "status": status, "tags": {"team": "a"}}


def test_job_died_is_failed_then_dead_lettered_at_the_next_two_versions():
    row = job(RUNNING, version=7, attempts=3)
    failed, dead = tr.job_died(row, "timeout", "too slow")
    assert (failed.version, dead.version) == (8, 9)
    assert failed.data == ev.Failed(attempt=3, reason="timeout", error="too slow")
    assert dead.data == ev.DeadLettered(attempt=3, error="too slow")
    assert {e.stream_id for e in (failed, dead)} == {row["id"]}
    assert failed.workflow_id == WORKFLOW_ID and failed.tags == {"team": "a"}
    assert tr.after(row, [failed, dead])["status"] == DEAD
    assert [e.data.attempt for e in tr.job_died(job(WAITING, attempts=0), "child_workflow", "x", attempt=0)] == [0, 0]


@pytest.mark.parametrize("status", [PENDING, BLOCKED, SUCCEEDED, DEAD, CANCELLED, SKIPPED])
def test_a_job_that_is_neither_running_nor_waiting_cannot_die(status):
    with pytest.raises(IllegalTransition):
        tr.job_died(job(status), "error", "boom")


def test_step_unblocked_checks_the_status_it_names():
    [event] = tr.step_unblocked(job(BLOCKED), WAITING, NOW, inputs={"a": 1})
    assert event.data == ev.StepUnblocked(status=WAITING, run_at=NOW, inputs={"a": 1}) and event.version == 4
    with pytest.raises(IllegalTransition):  # only a blocked step is unblocked
        tr.step_unblocked(job(PENDING), PENDING, NOW)


def test_step_skipped_and_reopened():
    [skipped] = tr.step_skipped(job(BLOCKED), "condition false", when={"step": "a"})
    assert skipped.data == ev.Skipped(reason="condition false", when={"step": "a"})
    with pytest.raises(IllegalTransition):
        tr.step_skipped(job(RUNNING), "deadline")
    batch = uuid.uuid4()
    [reopened] = tr.step_reopened(job(SKIPPED, version=5), BLOCKED, NOW, "resume", batch_id=batch)
    assert reopened.version == 6 and reopened.data.batch_id == batch
    with pytest.raises(IllegalTransition):
        tr.step_reopened(job(SUCCEEDED), PENDING, NOW, "resume")


def test_after_lets_a_second_constructor_follow_the_first():
    """A fan-out step unblocked and failed at once: versions run on, statuses too."""
    row = job(BLOCKED, version=2)
    unblocked = tr.step_unblocked(row, WAITING, NOW)
    died = tr.job_died(tr.after(row, unblocked), "fan_out", "not a list", attempt=0)
    assert [e.version for e in unblocked + died] == [3, 4, 5]
    with pytest.raises(IllegalTransition):  # without after(): the blocked step cannot fail
        tr.job_died(row, "fan_out", "not a list")


def test_workflow_ended_names_each_end():
    [ok] = tr.workflow_ended(workflow(RUNNING, version=4), SUCCEEDED, result=[1])
    assert ok.data == ev.WorkflowSucceeded(result=[1]) and ok.version == 5 and ok.stream_id == WORKFLOW_ID
    assert ok.workflow_id == WORKFLOW_ID
    [failed] = tr.workflow_ended(workflow(RUNNING), FAILED, error="deadline: x", reason="deadline")
    assert failed.data == ev.WorkflowFailed(error="deadline: x", reason="deadline")
    [cancelled] = tr.workflow_ended(workflow(RUNNING), CANCELLED)
    assert cancelled.data == ev.WorkflowCancelled()
    assert tr.after(workflow(RUNNING), [cancelled])["status"] == CANCELLED
    with pytest.raises(IllegalTransition):
        tr.workflow_ended(workflow(SUCCEEDED), FAILED, error="late")
    with pytest.raises(ValueError):
        tr.workflow_ended(workflow(RUNNING), PENDING)
    [resumed] = tr.workflow_resumed(workflow(FAILED), ["a"], "resume", None)
    assert resumed.data == ev.WorkflowResumed(steps=["a"], reason="resume")
    with pytest.raises(IllegalTransition):
        tr.workflow_resumed(workflow(RUNNING), ["a"], "resume", None)


def test_job_created_is_version_one():
    job_id = uuid.uuid4()
    [created] = tr.job_created(job_id, ev.Enqueued(task="t", status=BLOCKED), {"k": "v"}, WORKFLOW_ID)
    assert (created.stream_id, created.version, created.workflow_id) == (job_id, 1, WORKFLOW_ID)


# Each constructor, and the (event type, status it names) it writes, in order.
JOB_CONSTRUCTORS = {
    "job_died": (lambda row: tr.job_died(row, "error", "boom"),
                 [(ev.Failed.type, None), (ev.DeadLettered.type, None)]),
    "job_succeeded": (lambda row: tr.job_succeeded(row, 1), [(ev.Succeeded.type, None)]),
    "job_cancelled": (lambda row: tr.job_cancelled(row, "by hand"), [(ev.Cancelled.type, None)]),
    "job_retried_by_hand": (lambda row: tr.job_retried_by_hand(row, NOW), [(ev.Retried.type, None)]),
    "step_unblocked_pending": (lambda row: tr.step_unblocked(row, PENDING, NOW), [(ev.StepUnblocked.type, PENDING)]),
    "step_unblocked_waiting": (lambda row: tr.step_unblocked(row, WAITING, NOW), [(ev.StepUnblocked.type, WAITING)]),
    "step_skipped": (lambda row: tr.step_skipped(row, "skip"), [(ev.Skipped.type, None)]),
    "step_reopened_blocked": (lambda row: tr.step_reopened(row, BLOCKED, NOW, "resume"),
                              [(ev.StepReopened.type, BLOCKED)]),
    "step_triggered": (lambda row: tr.step_triggered(row, {}), [(ev.Triggered.type, None)]),
}


@given(name=st.sampled_from(sorted(JOB_CONSTRUCTORS)), status=st.sampled_from(sorted(states.statuses("job"))),
       version=st.integers(min_value=1, max_value=2**31 - 10))
def test_a_constructor_builds_exactly_what_the_state_table_allows(name, status, version):
    """From any status: the events come out when, and only when, each is a row of the table
    from the status the one before left; their versions follow the row's without a gap."""
    build, writes = JOB_CONSTRUCTORS[name]
    current, legal = status, True
    for event_type, wanted in writes:
        target = states.JOB_TRANSITIONS.get((current, event_type))
        if target is None or (isinstance(target, frozenset) and wanted not in target):
            legal = False
            break
        current = wanted if isinstance(target, frozenset) else target
    row = job(status, version=version)
    if not legal:
        with pytest.raises(IllegalTransition):
            build(row)
        return
    events = build(row)
    assert [event.data.type for event in events] == [event_type for event_type, _ in writes]
    assert [event.version for event in events] == list(range(version + 1, version + 1 + len(writes)))
    assert tr.after(row, events)["status"] == current
