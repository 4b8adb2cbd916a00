"""Property tests: random command sequences keep the projection equal to the fold of the
log, every status change follows the state machine table, and backoff follows its formula."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from qforge.commands.claim import claim
from qforge.commands.errors import Conflict
from qforge.commands.manage import cancel_job, recover_stale, retry_job
from qforge.commands.report import Report, complete, fail, heartbeat
from qforge.events import states
from qforge.events.types import parse_data
from tests.factories import make_job

ACTIONS = ["claim", "heartbeat", "heartbeat_stale", "complete", "complete_stale", "fail",
           "fail_stale", "cancel", "retry", "recover", "wait"]

# The live row against the row-by-row oracle's fold of the same events (tests/oracle_fold.sql).
PROJECTION_EQUALS_FOLD = """
SELECT to_jsonb(j) AS live, to_jsonb(f.folded) AS folded
  FROM jobs j,
       (SELECT oracle_job_fold(e ORDER BY e.version) AS folded FROM events e WHERE e.stream_id = %(id)s) f
 WHERE j.id = %(id)s
"""


def _check(conn, job_id) -> None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(PROJECTION_EQUALS_FOLD, {"id": job_id})
        row = cur.fetchone()
        assert row["live"] == row["folded"]
        cur.execute("SELECT type, schema_version, data FROM events WHERE stream_id = %s ORDER BY version",
                    (job_id,))
        status = None
        for event in cur.fetchall():  # replay the log through the Python table
            data = parse_data(event["type"], event["schema_version"], event["data"])
            status = states.next_status("job", status, event["type"], getattr(data, "status", None))
        assert status == row["live"]["status"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(st.sampled_from(ACTIONS), min_size=1, max_size=25),
       max_retries=st.integers(min_value=0, max_value=3))
def test_random_command_sequences_keep_projection_equal_to_fold(oracle, actions, max_retries):
    conn = oracle
    now = datetime.now(timezone.utc)
    queue = f"q{uuid.uuid4().hex}"  # examples share the database: claim only this example's job
    job_id = make_job(conn, max_retries=max_retries, now=now, queue=queue)
    attempt = 0
    for action in actions:
        report = Report(job_id, attempt, result={"a": attempt}, error="e")
        stale = Report(job_id, attempt - 1, result={"stale": True}, error="late")
        if action == "claim":
            got = claim(conn, [queue], 1, "w", now=now)
            attempt = got[0].attempt if got else attempt
        elif action == "heartbeat":
            heartbeat(conn, [report], actor="w", now=now)
        elif action == "heartbeat_stale":
            assert not heartbeat(conn, [stale], actor="w", now=now).accepted
        elif action == "complete":
            complete(conn, [report], actor="w", now=now)
        elif action == "complete_stale":
            assert not complete(conn, [stale], actor="w", now=now).accepted
        elif action == "fail":
            fail(conn, [report], actor="w", now=now)
        elif action == "fail_stale":
            assert not fail(conn, [stale], actor="w", now=now).accepted
        elif action in ("cancel", "retry"):
            try:
                (cancel_job if action == "cancel" else retry_job)(conn, job_id, now=now)
            except Conflict:
                pass
        elif action == "recover":
            recover_stale(conn, stale_seconds=5, now=now + timedelta(seconds=6))
        else:
            now += timedelta(seconds=400)  # past any backoff
        _check(conn, job_id)


@given(n=st.integers(min_value=1, max_value=40),
       base=st.floats(min_value=0, max_value=100), cap=st.floats(min_value=0, max_value=1000),
       jitter=st.floats(min_value=0, max_value=0.1))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_backoff_is_min_of_exponential_and_cap_plus_bounded_jitter(conn, n, base, cap, jitter):
    with conn.cursor() as cur:
        cur.execute("SELECT job_backoff_seconds(%s, %s, %s, %s) AS d", (n, base, cap, jitter))
        delay = cur.fetchone()["d"]
    expected = min(base * 2 ** (n - 1), cap)
    assert abs(delay - expected * (1 + jitter)) <= 1e-9 * max(1.0, expected)
    assert expected <= delay + 1e-9 and delay <= expected * 1.1 + 1e-9


def test_state_machine_table_is_consistent():
    for (source, event_type), target in states.JOB_TRANSITIONS.items():
        targets = [target] if isinstance(target, str) else sorted(target)
        for status in targets:
            assert status in states.statuses("job")
            assert states.next_status("job", source, event_type, status) == status
    # finished statuses are left only by an operator's retry or a resume of the workflow,
    # and a succeeded step never (resume keeps its output)
    for status in states.JOB_FINISHED:
        exits = {event for (source, event) in states.JOB_TRANSITIONS if source == status}
        assert exits <= {"Retried", "StepReopened"}, (status, exits)
    assert not {event for (source, event) in states.JOB_TRANSITIONS if source == states.SUCCEEDED}
    assert states.statuses("workflow") == {"running", "succeeded", "failed", "cancelled"}
