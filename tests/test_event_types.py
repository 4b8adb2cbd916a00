"""Event types are one set: the Python models, the state machine, the database's fold and its guards agree."""

from __future__ import annotations

import itertools
import json
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from qforge.api import dashboard_states
from qforge.events import states
from qforge.events import types as ev
from qforge.events.ids import new_id
from tests.factories import append_raw

T0 = datetime(2031, 1, 1, tzinfo=timezone.utc)


def test_models_state_machine_and_dashboard_name_the_same_event_types() -> None:
    # schedules, queue settings and stored definitions have no status machine (their folds
    # keep settings, or versions of a document)
    assert set(states.MACHINES) == set(ev.STREAM_TYPES) - {"schedule", "queue", "key", "definition"}
    for machine in states.MACHINES:
        in_table = {event_type for (_, event_type) in states.MACHINES[machine]}
        assert in_table == {name for name, m in ev.EVENT_DATA.items() if m.stream_type == machine}, machine
    assert (ev.JOB_EVENT_TYPES | ev.WORKFLOW_EVENT_TYPES | ev.TOKEN_EVENT_TYPES | ev.FLOW_EVENT_TYPES
            | ev.DEFINITION_EVENT_TYPES == ev.EVENT_TYPES == set(ev.EVENT_DATA))
    assert set(dashboard_states.event_status()) == ev.EVENT_TYPES
    assert set(dashboard_states.COLOURS) >= states.statuses("job") | states.statuses("workflow")


def test_the_database_state_machine_holds_the_python_types(conn: psycopg.Connection) -> None:
    rows = conn.execute("SELECT DISTINCT machine, event_type FROM state_transitions").fetchall()
    assert {(r["machine"], r["event_type"]) for r in rows} == {
        (machine, e) for machine, table in states.MACHINES.items() for (_, e) in table}


def test_state_allows_in_the_database_agrees_with_python(conn: psycopg.Connection) -> None:
    cases = []
    for machine in states.MACHINES:
        statuses = [None, ""] + sorted(states.statuses(machine)) + ["bogus"]
        cases += itertools.product([machine], statuses, sorted(ev.EVENT_TYPES | {"Bogus"}))
    rows = conn.execute(
        "SELECT state_allows(m, f, e) AS allowed FROM unnest(%s::text[], %s::text[], %s::text[])"
        " WITH ORDINALITY AS c(m, f, e, n) ORDER BY n", [list(column) for column in zip(*cases)]).fetchall()
    assert [row["allowed"] for row in rows] == [states.allows(*case) for case in cases]


# ---------------------------------------------------------------------------
# the fold applies every transition of the state machine, and refuses the rest

def _data(event_type: str, **overrides) -> ev.EventData:
    """Valid data of each type (what the commands would write)."""
    samples = {
        "Enqueued": dict(task="echo", run_at=T0, status="pending"),
        "StepUnblocked": dict(status="pending", run_at=T0, inputs={"a": 1}),
        "Skipped": dict(reason="condition not met"),
        "Claimed": dict(attempt=1, worker="w1"),
        "Heartbeat": dict(attempt=1, worker="w1"),
        "Succeeded": dict(attempt=1, result={"ok": True}),
        "Failed": dict(attempt=1, reason="error", error="boom"),
        "Retried": dict(attempt=1, delay_seconds=1.0, run_at=T0 + timedelta(seconds=1)),
        "DeadLettered": dict(attempt=1, error="boom"),
        "Released": dict(attempt=1, reason="shutdown"),
        "Cancelled": dict(reason="cancelled by test"),
        "Triggered": dict(payload={"approved": True}),
        "StepReopened": dict(status="blocked", run_at=T0, reason="resume"),
        "WorkflowResumed": dict(steps=["a"], reason="resume"),
        "DefinitionStored": dict(name="d", document={"steps": [{"step": "a", "task": "echo"}]}),
        "WorkflowSubmitted": dict(name="wf", steps=[{"step": "a", "task": "echo"}]),
        "WorkflowSucceeded": {},
        "WorkflowFailed": dict(error="a dead"),
        "WorkflowCancelled": {},
        "TokenCreated": dict(name="ci", scope="read"),
        "TokenRevoked": dict(name="ci"),
    }
    return ev.EVENT_DATA[event_type](**{**samples[event_type], **overrides})


# Paths through the state machine that, together, take every transition once at least.
JOB_PATHS: list[list[tuple[str, dict]]] = [
    [("Enqueued", {}), ("Claimed", {}), ("Heartbeat", {}), ("Succeeded", {})],
    [("Enqueued", {}), ("Claimed", {}), ("Failed", {}), ("Retried", {}), ("Claimed", {"attempt": 2}),
     ("Failed", {"attempt": 2}), ("DeadLettered", {"attempt": 2}), ("Retried", {"attempt": 2, "manual": True}),
     ("Cancelled", {}), ("Retried", {"attempt": 2, "manual": True})],
    [("Enqueued", {}), ("Claimed", {}), ("Released", {}), ("Claimed", {"attempt": 2}), ("Cancelled", {})],
    [("Enqueued", {"status": "blocked"}), ("StepUnblocked", {"status": "waiting"}), ("Triggered", {})],
    [("Enqueued", {"status": "blocked"}), ("StepUnblocked", {}), ("Cancelled", {})],
    [("Enqueued", {"status": "blocked"}), ("Skipped", {})],
    [("Enqueued", {"status": "blocked"}), ("Cancelled", {})],
    [("Enqueued", {"status": "waiting"}), ("Failed", {"attempt": 0, "reason": "timeout"}),
     ("DeadLettered", {"attempt": 0})],
    [("Enqueued", {"status": "waiting"}), ("Succeeded", {"attempt": None})],
    [("Enqueued", {"status": "waiting"}), ("Cancelled", {})],
    # a resumed workflow's steps: dead, cancelled and skipped ones run again;
    # a deadline skips what has not started
    [("Enqueued", {"status": "blocked"}), ("Skipped", {}), ("StepReopened", {}), ("StepUnblocked", {}),
     ("Skipped", {}), ("StepReopened", {"status": "waiting"}), ("Skipped", {}),
     ("StepReopened", {"status": "pending"}), ("Claimed", {}), ("Failed", {}), ("DeadLettered", {}),
     ("StepReopened", {"status": "pending"}), ("Cancelled", {}), ("StepReopened", {"status": "pending"})],
]
WORKFLOW_PATHS = [[("WorkflowSubmitted", {}), ("WorkflowSucceeded", {})],
                  [("WorkflowSubmitted", {}), ("WorkflowFailed", {})],
                  [("WorkflowSubmitted", {}), ("WorkflowCancelled", {}), ("WorkflowResumed", {}),
                   ("WorkflowFailed", {"reason": "deadline"}), ("WorkflowResumed", {})]]
TOKEN_PATHS = [[("TokenCreated", {}), ("TokenRevoked", {}), ("TokenCreated", {"scope": "admin"})]]


def _insert(conn, stream_id: uuid.UUID, version: int, data: ev.EventData) -> None:
    append_raw(conn, data.stream_type, stream_id, version, data.type,
               data.model_dump(mode="json", exclude_none=True), schema_version=data.schema_version,
               occurred_at=T0)


def test_the_fold_takes_every_transition_to_the_status_python_names(conn: psycopg.Connection) -> None:
    taken: set[tuple[str, str, str]] = set()
    for machine, paths, table in (("job", JOB_PATHS, "jobs"), ("workflow", WORKFLOW_PATHS, "workflows"),
                                  ("token", TOKEN_PATHS, "tokens")):
        for path in paths:
            stream_id, status = new_id(), None
            for version, (event_type, overrides) in enumerate(path, start=1):
                data = _data(event_type, **overrides)
                _insert(conn, stream_id, version, data)
                wanted = getattr(data, "status", None)
                expected = states.next_status(machine, status, event_type, wanted)
                taken.add((machine, status or states.NEW, event_type))
                row = conn.execute(f"SELECT status, version FROM {table} WHERE id = %s", (stream_id,)).fetchone()
                assert (row["status"], row["version"]) == (expected, version), (machine, path, event_type)
                status = expected
    every = {(machine, source, event) for machine, t in states.MACHINES.items() for (source, event) in t}
    assert taken == every


@pytest.mark.parametrize("stream_type", ["job", "workflow", "token"])
def test_the_fold_refuses_an_unknown_event_type(conn: psycopg.Connection, stream_type: str) -> None:
    first = _data({"job": "Enqueued", "workflow": "WorkflowSubmitted", "token": "TokenCreated"}[stream_type])
    stream_id = new_id()
    _insert(conn, stream_id, 1, first)
    with pytest.raises(psycopg.errors.CheckViolation):
        append_raw(conn, stream_type, stream_id, 2, "Teleported", {})


def test_upcasters_lead_to_the_current_version_of_each_type() -> None:
    for (event_type, version), _ in ev.UPCASTERS.items():
        assert version < ev.EVENT_DATA[event_type].schema_version
    for event_type, model in ev.EVENT_DATA.items():
        for version in range(1, model.schema_version):
            assert (event_type, version) in ev.UPCASTERS, (event_type, version)
    assert ev.parse_data("Failed", 1, {"attempt": 2, "message": "disk full"}) == ev.Failed(
        attempt=2, reason="error", error="disk full")


# ---------------------------------------------------------------------------
# twins: what Python writes and reads directly, without the models, must be what the models say

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from qforge.commands.enqueue import enqueued_data  # noqa: E402
from qforge.commands.specs import JobSpec  # noqa: E402

specs = st.builds(
    JobSpec, task=st.sampled_from(["echo", "send_email"]), queue=st.sampled_from(["default", "emails"]),
    priority=st.integers(-5, 5), max_retries=st.integers(0, 5),
    payload=st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 3), max_size=2),
    delay_seconds=st.one_of(st.none(), st.floats(0, 100)),
    timeout_seconds=st.one_of(st.none(), st.floats(0.5, 60)),
    idempotency_key=st.one_of(st.none(), st.text("abc", min_size=1, max_size=3)))


@settings(max_examples=200, deadline=None)
@given(spec=specs)
def test_enqueued_data_is_the_compact_dump_of_the_model(spec: JobSpec) -> None:
    fast = enqueued_data(spec, T0)
    run_at = fast.get("run_at")
    model = ev.Enqueued(task=spec.task, queue=spec.queue, priority=spec.priority, max_retries=spec.max_retries,
                        payload=spec.payload, timeout_seconds=spec.timeout_seconds,
                        idempotency_key=spec.idempotency_key, run_at=run_at)
    assert ev.Enqueued.model_validate(fast) == model
    assert set(fast) == set(model.model_dump(exclude_defaults=True))


def test_expand_in_python_agrees_with_event_read_data(conn: psycopg.Connection) -> None:
    cases = [("Enqueued", 1, {"task": "echo"}), ("Enqueued", 1, {"task": "e", "queue": "q", "run_at": "2031-01-01T00:00:00+00:00"}),
             ("Claimed", 1, {"attempt": 1}), ("Claimed", 1, {"attempt": 2, "worker": "w9"}),
             ("Heartbeat", 1, {"attempt": 1}), ("Succeeded", 1, {"attempt": 1}),
             ("Succeeded", 1, {"attempt": 1, "result": {"x": 1}}), ("Failed", 1, {"attempt": 1, "message": "m"}),
             ("Failed", 2, {"attempt": 1, "reason": "timeout", "error": "e"}), ("Cancelled", 1, {"reason": "r"})]
    at = T0 + timedelta(microseconds=123456)
    for event_type, version, data in cases:
        row = conn.execute("SELECT event_read_data(%s, %s::smallint, %s::jsonb, 'actor-1', %s) AS d",
                           (event_type, version, json.dumps(data), at)).fetchone()
        assert row["d"] == ev.expand(event_type, version, data, "actor-1", at), (event_type, data)
