"""The claim (job_claim_plain) and the completion (job_complete) fold their own events in their
own statement, and events_project() then leaves those rows alone (jobs_folded, 30_fold.sql).
The rows must be what the general fold makes of the same log (replay), with the hash chain
unbroken, also when another transaction changed a row between the statement's snapshot and
its lock."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from qforge.audit.verify import verify as audit_verify
from qforge.commands.claim import claim
from qforge.commands.enqueue import JobSpec, enqueue
from qforge.commands.manage import cancel_job, retry_job
from qforge.commands.queues import QueueSettingsSpec, configure_queue
from qforge.commands.report import Report, complete, heartbeat
from qforge.projections.replay import verify as replay_verify
from tests.factories import append_raw, count, event_types, job_row


def _waiting_on_a_lock(conn, pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if count(conn, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", pid) == "Lock":
            return
        time.sleep(0.02)
    raise AssertionError(f"backend {pid} never waited on a lock")


def _in_thread(target) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = target()
        except BaseException as exc:  # surfaced by the test
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_claims_and_completions_fold_their_rows_as_the_log_says(conn) -> None:
    jobs = enqueue(conn, [JobSpec(task="echo", payload={"i": i}) for i in range(6)], actor="api")
    with conn.transaction():
        claimed = claim(conn, ["default"], 4, "w1")
        # the statement's note to events_project() is gone with the statement
        assert count(conn, "SELECT current_setting('qforge.folded', true)") == ""
    assert [job.id for job in claimed] == [job.id for job in jobs[:4]]
    assert {job.attempt for job in claimed} == {1}
    results = [{"n": 1}, None, [1, 2], "text"]
    outcome = complete(conn, [Report(job.id, job.attempt, result=result)
                              for job, result in zip(claimed, results)], actor="w1")
    assert sorted(outcome.accepted) == sorted(job.id for job in claimed)
    for job, result in zip(claimed, results):
        row = job_row(conn, job.id)
        assert (row["status"], row["version"], row["attempts"], row["worker"]) == ("succeeded", 3, 1, "w1")
        assert row["result"] == result
        assert row["started_at"] is not None and row["finished_at"] is not None
        assert event_types(conn, job.id) == ["Enqueued", "Claimed", "Succeeded"]
    untouched = job_row(conn, jobs[5].id)
    assert (untouched["status"], untouched["version"]) == ("pending", 1)
    # a superseded attempt's report, and a report of a job never claimed, change nothing
    stale = complete(conn, [Report(claimed[0].id, 2, result=None), Report(jobs[5].id, 1, result=None)],
                     actor="w1")
    assert stale.accepted == [] and job_row(conn, jobs[5].id)["version"] == 1
    assert replay_verify(conn) == []
    assert audit_verify(conn).holds


def test_a_claim_that_finds_keyed_jobs_hands_over_to_the_full_claim(conn) -> None:
    # job_claim_plain claims nothing and answers "run job_claim", which folds through
    # events_project(): the note of the plain statement must not make it skip those rows
    keyed = enqueue(conn, [JobSpec(task="echo", concurrency_key="k", concurrency_limit=5)], actor="api")[0]
    plain = enqueue(conn, [JobSpec(task="echo")], actor="api")[0]
    with conn.transaction():
        got = claim(conn, ["default"], 10, "w1")
    assert {job.id for job in got} == {keyed.id, plain.id}
    for job_id in (keyed.id, plain.id):
        assert (job_row(conn, job_id)["status"], job_row(conn, job_id)["version"]) == ("running", 2)
    assert replay_verify(conn) == []


def test_a_row_changed_between_the_claims_snapshot_and_its_lock(conn, db_url) -> None:
    # The claim's snapshot sees the job pending (version 1); before the claim reaches it,
    # another transaction cancels and retries it (version 3, pending again, at another
    # address), and the claim's lock takes that newest version. The claim waits on the
    # rate-limited queue's bucket (one shard, which claimers wait for), which a third connection
    # holds, after taking its snapshot.
    configure_queue(conn, "limited", QueueSettingsSpec(rate_per_second=5.0, burst=5), actor="api")
    job = enqueue(conn, [JobSpec(task="echo", queue="limited")], actor="api")[0]
    later = datetime.now(timezone.utc) + timedelta(hours=1)  # the retried job's run_at is due then
    with psycopg.connect(db_url) as holder, psycopg.connect(db_url, autocommit=True) as claimer:
        holder.execute("SELECT 1 FROM queue_buckets WHERE queue = 'limited' FOR UPDATE")
        thread, out = _in_thread(lambda: claim(claimer, ["limited"], 10, "w1", now=later))
        _waiting_on_a_lock(conn, claimer.info.backend_pid)
        cancel_job(conn, job.id, actor="api")
        retry_job(conn, job.id, actor="api")
        assert job_row(conn, job.id)["version"] == 3
        holder.rollback()
        thread.join(30)
    assert "error" not in out, out.get("error")
    assert [claimed.id for claimed in out["value"]] == [job.id]
    row = job_row(conn, job.id)
    assert (row["status"], row["version"], row["worker"]) == ("running", 4, "w1")
    assert event_types(conn, job.id) == ["Enqueued", "Cancelled", "Retried", "Claimed"]
    assert replay_verify(conn) == []
    assert audit_verify(conn).holds


def test_a_completion_waits_for_a_heartbeat_and_chains_after_it(conn, db_url) -> None:
    job = enqueue(conn, [JobSpec(task="echo")], actor="api")[0]
    [claimed] = claim(conn, ["default"], 1, "w1")
    with psycopg.connect(db_url) as beating, psycopg.connect(db_url, autocommit=True) as reporter:
        beating.execute("SELECT 1")  # a transaction of its own, which the heartbeat's block joins
        assert heartbeat(beating, [Report(job.id, claimed.attempt)], actor="w1").accepted == [job.id]
        # still in the heartbeat's transaction: the completion waits for its row lock
        thread, out = _in_thread(lambda: complete(reporter, [Report(job.id, claimed.attempt, result=7)],
                                                  actor="w1"))
        _waiting_on_a_lock(conn, reporter.info.backend_pid)
        beating.commit()
        thread.join(30)
    assert "error" not in out, out.get("error")
    assert out["value"].accepted == [job.id]
    row = job_row(conn, job.id)
    assert (row["status"], row["version"], row["result"]) == ("succeeded", 4, 7)
    assert event_types(conn, job.id) == ["Enqueued", "Claimed", "Heartbeat", "Succeeded"]
    assert replay_verify(conn) == []
    assert audit_verify(conn).holds


@pytest.mark.parametrize("folded", ["1:2000-01-01 00:00:00+00", "7:now"])
def test_a_stale_note_fails_the_append_instead_of_skipping_its_fold(conn, folded) -> None:
    # events_project() skips only the statement's own events, as many as the note says,
    # written in that statement; any other note fails the append rather than leave rows unfolded
    job = enqueue(conn, [JobSpec(task="echo")], actor="api")[0]
    with pytest.raises(psycopg.InternalError, match="folded by their statement"):
        with conn.transaction():
            conn.execute("SELECT set_config('qforge.folded', %s, true)", (folded,))
            append_raw(conn, "job", job.id, 2, "Claimed", {"attempt": 1})  # folded by events_project()
    assert job_row(conn, job.id)["version"] == 1

