"""The job lifecycle: retries with backoff, dead-letter, manual retry, cancel, fencing."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from qforge.commands.claim import claim
from qforge.commands.enqueue import JobSpec, enqueue
from qforge.commands.errors import Conflict
from qforge.commands.manage import cancel_job, recover_stale, retry_job
from qforge.commands.report import Report, complete, fail, heartbeat
from qforge.db import connect
from tests.factories import append_raw, claim_one, count, event_types, fail_once, job_row, make_job


@pytest.fixture
def backoff(monkeypatch):
    monkeypatch.setenv("QFORGE_BACKOFF_BASE_SECONDS", "2")
    monkeypatch.setenv("QFORGE_BACKOFF_CAP_SECONDS", "5")


def test_failures_back_off_exponentially_then_dead_letter(conn, backoff):
    now = datetime.now(timezone.utc)
    job_id = make_job(conn, max_retries=3, now=now)
    delays = []
    for attempt in range(1, 5):
        job = claim_one(conn, now=now)
        assert job.attempt == attempt
        outcome = fail_once(conn, job, error=f"boom {attempt}", now=now)
        assert outcome.accepted == [job_id]
        row = job_row(conn, job_id)
        if attempt <= 3:
            assert row["status"] == "pending"
            delay = (row["run_at"] - now).total_seconds()
            expected = min(2 * 2 ** (attempt - 1), 5)
            assert expected <= delay <= expected * 1.1 + 1e-6, (attempt, delay)
            delays.append(delay)
            now = row["run_at"]
        else:
            assert outcome.dead == [job_id]
            assert row["status"] == "dead" and row["last_error"] == "boom 4"
    assert len(delays) == 3
    assert event_types(conn, job_id) == ["Enqueued"] + [
        "Claimed", "Failed", "Retried"] * 3 + ["Claimed", "Failed", "DeadLettered"]


def test_max_retries_zero_runs_once(conn):
    job_id = make_job(conn, max_retries=0)
    fail_once(conn, claim_one(conn))
    assert job_row(conn, job_id)["status"] == "dead"


def test_manual_retry_of_a_dead_job_gives_it_a_fresh_budget(conn, backoff):
    job_id = make_job(conn, max_retries=1)
    now = datetime.now(timezone.utc)
    fail_once(conn, claim_one(conn, now=now), now=now)
    fail_once(conn, claim_one(conn, now=now + timedelta(minutes=1)), now=now)
    assert job_row(conn, job_id)["status"] == "dead"
    retry_job(conn, job_id)
    row = job_row(conn, job_id)
    assert row["status"] == "pending" and row["attempts"] == 2
    job = claim_one(conn)
    assert job.attempt == 3
    fail_once(conn, job)
    assert job_row(conn, job_id)["status"] == "pending", "the retry budget was not renewed"
    assert event_types(conn, job_id)[-5:] == ["DeadLettered", "Retried", "Claimed", "Failed", "Retried"]


def test_retry_of_a_pending_or_running_job_is_a_conflict(conn):
    job_id = make_job(conn)
    with pytest.raises(Conflict):
        retry_job(conn, job_id)
    claim_one(conn)
    with pytest.raises(Conflict):
        retry_job(conn, job_id)


def test_cancel_pending_and_cancel_finished_conflicts(conn):
    job_id = make_job(conn)
    cancel_job(conn, job_id)
    assert job_row(conn, job_id)["status"] == "cancelled"
    with pytest.raises(Conflict):
        cancel_job(conn, job_id)
    retry_job(conn, job_id)
    assert job_row(conn, job_id)["status"] == "pending"


def test_cancelled_running_job_rejects_its_workers_heartbeat_and_completion(conn):
    job_id = make_job(conn)
    job = claim_one(conn)
    cancel_job(conn, job_id)
    assert heartbeat(conn, [Report(job.id, job.attempt)], actor="w1").rejected == [job_id]
    assert complete(conn, [Report(job.id, job.attempt, result=1)], actor="w1").rejected == [job_id]
    assert job_row(conn, job_id)["status"] == "cancelled"


def test_late_reports_from_a_superseded_attempt_are_rejected_and_append_nothing(conn):
    job_id = make_job(conn, max_retries=3)
    now = datetime.now(timezone.utc)
    zombie = claim_one(conn, worker="zombie", now=now)
    later = now + timedelta(seconds=30)
    assert recover_stale(conn, stale_seconds=10, now=later) == [job_id]
    fresh = claim_one(conn, worker="fresh", now=later + timedelta(minutes=10))
    assert fresh.attempt == zombie.attempt + 1
    before = count(conn, "SELECT count(*) FROM events")
    stale = [Report(zombie.id, zombie.attempt, result={"from": "zombie"}, error="late")]
    assert heartbeat(conn, stale, actor="zombie").rejected == [job_id]
    assert complete(conn, stale, actor="zombie").rejected == [job_id]
    assert fail(conn, stale, actor="zombie").rejected == [job_id]
    assert count(conn, "SELECT count(*) FROM events") == before
    complete(conn, [Report(fresh.id, fresh.attempt, result={"from": "fresh"})], actor="fresh")
    row = job_row(conn, job_id)
    assert row["status"] == "succeeded" and row["result"] == {"from": "fresh"}
    assert complete(conn, [Report(fresh.id, fresh.attempt, result=2)], actor="fresh").rejected == [job_id]


def test_stale_recovery_counts_as_an_attempt(conn):
    job_id = make_job(conn, max_retries=0)
    now = datetime.now(timezone.utc)
    claim_one(conn, now=now)
    recover_stale(conn, stale_seconds=5, now=now + timedelta(seconds=6))
    row = job_row(conn, job_id)
    assert row["status"] == "dead"
    with conn.cursor() as cur:
        cur.execute("SELECT data FROM events WHERE stream_id = %s AND type = 'Failed'", (job_id,))
        assert cur.fetchone()["data"]["reason"] == "heartbeat_timeout"


def test_batch_complete_and_fail_in_one_call(conn):
    for i in range(6):
        make_job(conn, payload={"i": i}, max_retries=0)
    jobs = claim(conn, ["default"], 6, "w")
    ok = complete(conn, [Report(j.id, j.attempt, result=j.payload) for j in jobs[:3]], actor="w")
    bad = fail(conn, [Report(j.id, j.attempt, error="x") for j in jobs[3:]], actor="w")
    assert len(ok.accepted) == 3 and len(bad.dead) == 3
    assert count(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 3
    assert count(conn, "SELECT count(*) FROM jobs WHERE status = 'dead'") == 3


def test_concurrent_enqueues_with_one_idempotency_key_make_one_job(conn, db_url):
    results, barrier = [], threading.Barrier(8)

    def run() -> None:
        with connect(db_url, autocommit=True) as own:
            barrier.wait()
            results.append(enqueue(own, [JobSpec(task="echo", idempotency_key="order-42")])[0])

    threads = [threading.Thread(target=run) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({r.id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert count(conn, "SELECT count(*) FROM jobs") == 1
    assert count(conn, "SELECT count(*) FROM events WHERE type = 'Enqueued'") == 1


def test_events_refuse_update_and_delete(conn):
    make_job(conn)
    for statement in ("UPDATE events SET actor = 'x'", "DELETE FROM events",
                      "TRUNCATE events CASCADE"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)
    assert count(conn, "SELECT count(*) FROM events") == 1


def test_an_illegal_transition_is_refused_by_the_database(conn):
    job_id = make_job(conn)
    with pytest.raises(psycopg.errors.CheckViolation):
        append_raw(conn, "job", job_id, 2, "Succeeded", {})
    assert job_row(conn, job_id)["status"] == "pending"


def test_a_writer_with_a_stale_version_is_refused(conn):
    job_id = make_job(conn)
    claim_one(conn)  # version 2
    with pytest.raises(psycopg.errors.UniqueViolation):  # a writer that read version 1
        append_raw(conn, "job", job_id, 2, "Cancelled", {"reason": "stale"})
    with pytest.raises(psycopg.errors.UniqueViolation):  # one that thinks the job is new
        append_raw(conn, "job", job_id, 1, "Enqueued", {"task": "echo"})
