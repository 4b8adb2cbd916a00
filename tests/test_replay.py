"""Replay: rebuild, verify, swap, as-of reads, the upcaster, the compiled state machine and the CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from uuid import UUID

import psycopg
import pytest
from psycopg import sql

from qforge.workflows import engine as wf
from qforge.commands.claim import claim
from qforge.commands.report import Report, complete
from qforge.db import connect
from qforge.events import states
from qforge.events import types as ev
from qforge.events.store import read_stream
from qforge.projections import replay
from qforge.projections.asof import job_as_of, workflow_as_of
from qforge.projections.jobs import get_job
from qforge.projections.workflows import get_workflow
from tests.factories import append_raw, claim_one, fail_once, job_row, make_job

ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2031, 3, 1, tzinfo=timezone.utc)


def last_position(conn) -> int:
    return conn.execute("SELECT coalesce(max(position), 0) AS p FROM events").fetchone()["p"]


def small_history(conn) -> dict[str, UUID]:
    """A job in each state and a finished workflow, through the commands."""
    ids = {"pending": make_job(conn, now=T0, tags={"team": "red"})}
    ids["succeeded"] = make_job(conn, now=T0, queue="q2")
    job = claim_one(conn, queue="q2", now=T0)
    complete(conn, [Report(job.id, job.attempt, result={"x": 1})], actor="w1", now=T0)
    ids["dead"] = make_job(conn, now=T0, queue="q3", max_retries=0)
    fail_once(conn, claim_one(conn, queue="q3", now=T0), now=T0)
    ids["running"] = make_job(conn, now=T0, queue="q4")
    claim_one(conn, queue="q4", now=T0)
    spec = wf.WorkflowSpec.model_validate({"name": "ci", "tags": {"team": "blue"}, "steps": [
        {"step": "build", "task": "echo", "queue": "wq"},
        {"step": "ship", "task": "echo", "depends_on": ["build"], "queue": "wq"}]})
    ids["workflow"] = wf.submit(conn, spec, now=T0)[0]
    for _ in range(2):
        for step in claim(conn, ["wq"], 10, "w1", now=T0):
            complete(conn, [Report(step.id, step.attempt, result={"step": step.step},
                                   workflow_id=step.workflow_id)],
                     actor="w1", now=T0, workflow_ids_known=True)
    return ids


# ---------------------------------------------------------------------------
# replay equals live


def test_rebuild_of_a_mixed_history_has_the_live_rows(conn):
    small_history(conn)
    stats = replay.rebuild(conn)
    assert stats.events == last_position(conn) and stats.as_of is None
    rows = sql.SQL("SELECT to_jsonb(t) AS row FROM {} t ORDER BY 1")
    for table in ("jobs", "workflows", "execution_tags"):
        live = conn.execute(rows.format(sql.Identifier(table))).fetchall()
        rebuilt = conn.execute(rows.format(sql.Identifier("qforge_replay", table))).fetchall()
        assert live == rebuilt and stats.rows[table] == len(live), table
    assert replay.verify(conn) == []


def test_verify_needs_a_connection_outside_a_transaction(db_url):
    with connect(db_url) as plain:  # not autocommit: the SELECT opens a transaction
        plain.execute("SELECT 1")
        with pytest.raises(ValueError, match="transaction"):
            replay.verify(plain)


# ---------------------------------------------------------------------------
# verify finds and names what differs; swap repairs it


def test_corrupted_missing_and_extra_rows_are_found_and_named(conn):
    ids = small_history(conn)
    corrupted, missing = ids["pending"], ids["dead"]
    conn.execute("UPDATE jobs SET status = 'succeeded', attempts = 7 WHERE id = %s", (corrupted,))
    conn.execute("DELETE FROM jobs WHERE id = %s", (missing,))
    extra = UUID("00000000-0000-7000-8000-0000000000aa")
    conn.execute("INSERT INTO jobs"
                 " SELECT (jsonb_populate_record(j, jsonb_build_object('id', %s::text))).*"
                 "  FROM jobs j WHERE id = %s", (str(extra), ids["succeeded"]))
    conn.execute("UPDATE workflows SET status = 'failed' WHERE id = %s", (ids["workflow"],))
    conn.execute("DELETE FROM execution_tags WHERE id = %s", (corrupted,))

    found = {(d.table, d.id, d.kind): d for d in replay.verify(conn, chunk_positions=2)}
    assert set(found) == {
        ("jobs", corrupted, "differs"), ("jobs", missing, "missing"), ("jobs", extra, "extra"),
        ("workflows", ids["workflow"], "differs"), ("execution_tags", corrupted, "missing"),
    }
    assert found["jobs", corrupted, "differs"].columns == {
        "status": ("succeeded", "pending"), "attempts": (7, 0)}
    assert found["workflows", ids["workflow"], "differs"].columns == {
        "status": ("failed", "succeeded")}
    described = found["jobs", corrupted, "differs"].describe()
    assert str(corrupted) in described and 'status live "succeeded" rebuilt "pending"' in described
    assert "missing from the live table" in found["jobs", missing, "missing"].describe()
    assert "not in the log" in found["jobs", extra, "extra"].describe()
    assert "tag team=red" in found["execution_tags", corrupted, "missing"].describe()

    replay.rebuild(conn)
    swapped = replay.swap(conn)
    assert (swapped.deleted["jobs"], swapped.updated["jobs"], swapped.inserted["jobs"]) == (1, 1, 1)
    assert swapped.updated["workflows"] == 1 and swapped.inserted["execution_tags"] == 1
    assert replay.verify(conn) == []
    assert job_row(conn, corrupted)["status"] == "pending"


def test_swap_touches_no_row_that_already_matches(conn):
    small_history(conn)
    before = conn.execute("SELECT xmin::text AS x, id FROM jobs ORDER BY id").fetchall()
    replay.rebuild(conn)
    swapped = replay.swap(conn)
    assert swapped.changed == 0 and swapped.marked == 0 and swapped.refolded_streams == 0
    assert conn.execute("SELECT xmin::text AS x, id FROM jobs ORDER BY id").fetchall() == before


def test_swap_folds_again_the_streams_that_changed_after_the_rebuild(conn):
    ids = small_history(conn)
    replay.rebuild(conn)
    later = make_job(conn, now=T0, tags={"team": "green"})  # events the rebuild did not see
    conn.execute("UPDATE jobs SET priority = 99 WHERE id = %s", (ids["running"],))
    swapped = replay.swap(conn)
    assert swapped.refolded_streams == 1 and swapped.marked == 2
    assert swapped.updated["jobs"] == 1 and swapped.inserted["jobs"] == 0
    assert replay.verify(conn) == []
    assert conn.execute("SELECT count(*) AS n FROM qforge_replay.jobs WHERE id = %s",
                        (later,)).fetchone()["n"] == 1


def test_swap_while_workers_claim_and_complete(conn, db_url):
    for _ in range(300):
        make_job(conn, queue="busy")
    conn.execute("UPDATE jobs SET payload = '{\"tampered\": true}' WHERE id IN"
                 " (SELECT id FROM jobs ORDER BY id LIMIT 5)")
    replay.rebuild(conn)
    stop = threading.Event()
    errors: list[BaseException] = []
    done = []

    def work() -> None:
        try:
            with connect(db_url, autocommit=True) as worker:
                while not stop.is_set():
                    jobs = claim(worker, ["busy"], 5, "racer")
                    if not jobs:
                        return
                    complete(worker, [Report(j.id, j.attempt, result={}) for j in jobs],
                             actor="racer")
                    done.extend(jobs)
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(3)]
    for thread in workers:
        thread.start()
    try:
        swapped = replay.swap(conn, lock_timeout=0.05)
    finally:
        stop.set()
        for thread in workers:
            thread.join(timeout=30)
    assert errors == []
    assert swapped.updated["jobs"] >= 5
    assert replay.verify(conn) == []
    assert done  # the workers really ran alongside


def test_rebuild_refuses_to_use_the_live_schema_as_scratch(conn):
    job_id = make_job(conn)
    for schema in ("public", "pg_catalog"):
        with pytest.raises(replay.ReplayError, match="cannot be a scratch schema"):
            replay.rebuild(conn, schema)
    assert job_row(conn, job_id) is not None


def test_swap_needs_a_rebuild_of_the_whole_log(conn):
    small_history(conn)
    with pytest.raises(replay.ReplayError, match="no rebuild"):
        replay.swap(conn, "qforge_never_built")
    replay.rebuild(conn, as_of_position=3)
    with pytest.raises(replay.ReplayError, match="as of position 3"):
        replay.swap(conn)


# ---------------------------------------------------------------------------
# as of a position


def test_job_as_of_each_position_is_what_the_live_table_showed_then(conn):
    seen: dict[int, dict] = {}
    job_id = make_job(conn, now=T0, max_retries=1)
    seen[last_position(conn)] = get_job(conn, job_id)
    job = claim_one(conn, now=T0 + timedelta(seconds=1))
    seen[last_position(conn)] = get_job(conn, job_id)
    fail_once(conn, job, error="first", now=T0 + timedelta(seconds=2))
    seen[last_position(conn)] = get_job(conn, job_id)
    job = claim_one(conn, now=T0 + timedelta(seconds=9))
    complete(conn, [Report(job.id, job.attempt, result={"ok": True})], actor="w1",
             now=T0 + timedelta(seconds=10))
    seen[last_position(conn)] = get_job(conn, job_id)
    assert job_as_of(conn, job_id, 0) is None
    for position, view in seen.items():
        assert job_as_of(conn, job_id, position) == view
    assert [seen[p]["status"] for p in sorted(seen)] == ["pending", "running", "pending", "succeeded"]
    assert job_as_of(conn, job_id, 10**12) == get_job(conn, job_id)


def test_workflow_as_of_shows_its_steps_as_they_were(conn):
    spec = wf.WorkflowSpec.model_validate({"name": "pipe", "steps": [
        {"step": "a", "task": "echo", "queue": "wq"},
        {"step": "b", "task": "echo", "depends_on": ["a"], "queue": "wq"}]})
    workflow_id = wf.submit(conn, spec, now=T0)[0]
    submitted = (last_position(conn), get_workflow(conn, workflow_id))
    step = claim(conn, ["wq"], 1, "w1", now=T0)[0]
    complete(conn, [Report(step.id, step.attempt, result={"a": 1}, workflow_id=workflow_id)],
             actor="w1", now=T0, workflow_ids_known=True)
    halfway = (last_position(conn), get_workflow(conn, workflow_id))
    for position, view in (submitted, halfway):
        assert workflow_as_of(conn, workflow_id, position) == view
    assert [s["status"] for s in halfway[1]["steps"]] == ["succeeded", "pending"]
    first_event = conn.execute("SELECT min(position) AS p FROM events WHERE stream_id = %s",
                               (workflow_id,)).fetchone()["p"]
    assert workflow_as_of(conn, workflow_id, first_event - 1) is None


def test_as_of_rebuild_counts_and_time_form(conn):
    first = make_job(conn, now=T0)
    cut = last_position(conn)
    second = make_job(conn, now=T0 + timedelta(minutes=5))
    stats = replay.rebuild(conn, as_of_position=cut)
    assert stats.rows["jobs"] == 1 and stats.last_position == cut
    assert replay.status_counts(conn) == {"jobs": {"pending": 1}, "workflows": {}}
    assert replay.position_at(conn, T0 + timedelta(minutes=1)) == cut
    assert replay.position_at(conn, (T0 + timedelta(minutes=1)).replace(tzinfo=None)) == cut
    assert replay.position_at(conn, T0 - timedelta(days=1)) == 0
    assert replay.position_at(conn, T0 + timedelta(days=1)) == last_position(conn)
    assert {first, second} == {r["id"] for r in conn.execute("SELECT id FROM jobs").fetchall()}


# ---------------------------------------------------------------------------
# schema evolution


def test_v1_failed_event_is_read_back_as_v2_and_folded(conn):
    job_id = make_job(conn, now=T0, max_retries=2)
    job = claim_one(conn, now=T0)
    row = job_row(conn, job_id)
    # What a writer of schema version 1 appended: {"attempt", "message"}.
    append_raw(conn, "job", job_id, row["version"] + 1, "Failed", {"attempt": job.attempt, "message": "disk full"},
               occurred_at=T0)
    append_raw(conn, "job", job_id, row["version"] + 2, "Retried",
               {"attempt": job.attempt, "delay_seconds": 1, "run_at": (T0 + timedelta(seconds=1)).isoformat()},
               occurred_at=T0)
    failed = [e for e in read_stream(conn, job_id) if e.type == ev.Failed.type]
    assert len(failed) == 1
    assert failed[0].schema_version == ev.Failed.schema_version == 2
    assert failed[0].data == {"attempt": 1, "reason": "error", "error": "disk full"}
    # The Python upcaster, beside the model, agrees with the database's.
    assert ev.upcast("Failed", 1, {"attempt": 1, "message": "disk full"}) == failed[0].data
    stored = conn.execute("SELECT schema_version, data FROM events WHERE stream_id = %s"
                          " AND type = 'Failed'", (job_id,)).fetchone()
    assert stored == {"schema_version": 1, "data": {"attempt": 1, "message": "disk full"}}
    live = job_row(conn, job_id)
    assert (live["status"], live["last_error"]) == ("pending", "disk full")
    assert job_as_of(conn, job_id, last_position(conn))["last_error"] == "disk full"
    assert replay.verify(conn) == []


# ---------------------------------------------------------------------------
# the fold's state machine in the database answers as the Python table


def _next_or_none(machine, status, event_type, wanted):
    try:
        return states.next_status(machine, status, event_type, wanted)
    except states.IllegalTransition:
        return None


def test_state_target_in_the_database_agrees_with_the_python_table(conn):
    cases = []
    for machine, table in states.MACHINES.items():
        statuses = sorted(states.statuses(machine))
        events = sorted(ev.JOB_EVENT_TYPES | ev.WORKFLOW_EVENT_TYPES | {"Bogus"})
        cases += itertools.product([machine], [None, ""] + statuses, events, [None, "bogus"] + statuses)
    rows = conn.execute(
        "SELECT state_target(m, f, e, w) AS got"
        " FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[])"
        "      WITH ORDINALITY AS c(m, f, e, w, n)"
        " ORDER BY n", [list(column) for column in zip(*cases)]).fetchall()
    got = [row["got"] for row in rows]
    expected = [_next_or_none(*case) for case in cases]
    assert got == expected
    assert sum(value is not None for value in expected) > 30


# ---------------------------------------------------------------------------
# qforge replay


def qforge(db_url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qforge.cli", "--database-url", db_url, "replay", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_cli_verify_exits_0_then_1_naming_the_corrupted_job_then_replay_repairs(conn, db_url):
    ids = small_history(conn)
    clean = qforge(db_url, "--verify")
    assert clean.returncode == 0, clean.stderr
    assert "no differences" in clean.stdout
    conn.execute("UPDATE jobs SET status = 'succeeded' WHERE id = %s", (ids["pending"],))
    dirty = qforge(db_url, "--verify")
    assert dirty.returncode == 1, dirty.stderr
    assert str(ids["pending"]) in dirty.stdout and "1 difference(s) in jobs" in dirty.stdout
    repaired = qforge(db_url)
    assert repaired.returncode == 0, repaired.stderr
    assert "1 rows changed" in repaired.stdout
    assert qforge(db_url, "--verify").returncode == 0


def test_cli_as_of_prints_counts_and_does_not_swap(conn, db_url):
    make_job(conn, now=T0)
    cut = last_position(conn)
    make_job(conn, now=T0 + timedelta(hours=1))
    by_position = qforge(db_url, "--as-of", str(cut))
    assert by_position.returncode == 0, by_position.stderr
    assert f"state as of position {cut}" in by_position.stdout
    assert "jobs: 1 (pending 1)" in by_position.stdout
    by_time = qforge(db_url, "--as-of-time", (T0 + timedelta(minutes=1)).isoformat())
    assert by_time.returncode == 0 and f"position {cut}" in by_time.stdout
    assert conn.execute("SELECT count(*) AS n FROM jobs").fetchone()["n"] == 2
    refused = qforge(db_url, "--verify", "--as-of", "1")
    assert refused.returncode == 2 and "cannot be combined" in refused.stderr


def test_progress_is_reported_chunk_by_chunk(conn):
    for _ in range(5):
        make_job(conn, now=T0)
    seen: list[tuple[int, int]] = []
    replay.rebuild(conn, chunk_positions=1, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(n, 5) for n in range(1, 6)]
    seen.clear()
    replay.rebuild(conn, as_of_position=2, chunk_positions=1,
                   progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 2), (2, 2)]
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
