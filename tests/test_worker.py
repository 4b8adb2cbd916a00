"""Worker commands and read models without processes: Released hand-backs and the worker registry."""

from __future__ import annotations

import contextlib
from datetime import datetime, timezone
from pathlib import Path

import psycopg
import pytest
from psycopg import pq

from qforge.commands import workers
from qforge.commands.claim import claim, plan_generically
from qforge.commands.manage import cancel_job
from qforge.commands.report import Report
from qforge.projections.workers import live_workers, pods
from qforge.workers import reporting
from qforge.workers.connection import connect
from qforge.workers.worker import Worker
from test_worker_support import add_jobs, history, job, registry


def worker_info(name: str, concurrency: int = 2) -> workers.WorkerInfo:
    return workers.WorkerInfo(name=name, host="host", pid=42, queues=["default", "mail"], concurrency=concurrency,
                              started_at=datetime.now(timezone.utc))


def test_release_hands_a_running_job_back_without_using_its_attempt(conn):
    (job_id,) = add_jobs(conn, {"task": "echo", "max_retries": 0})
    (claimed,) = claim(conn, ["default"], 1, "w1")

    outcome = workers.release(conn, [Report(job_id, claimed.attempt)], actor="w1")

    assert outcome.accepted == [job_id] and outcome.rejected == []
    row = job(conn, job_id)
    assert (row["status"], row["attempts"], row["free_attempts"]) == ("pending", 1, 1)
    released = history(conn, job_id)[-1]
    assert (released.type, released.data, released.actor) == ("Released", {"attempt": 1, "reason": "shutdown"}, "w1")
    (again,) = claim(conn, ["default"], 1, "w2")
    assert again.attempt == 2


def test_release_of_a_superseded_or_finished_claim_is_rejected(conn):
    first_id, second_id = add_jobs(conn, {"task": "echo"}, {"task": "echo"})
    claim(conn, ["default"], 2, "w1")
    cancel_job(conn, second_id, actor="test")

    outcome = workers.release(conn, [Report(first_id, 7), Report(second_id, 1)], actor="w1")

    assert outcome.accepted == [] and sorted(outcome.rejected) == sorted([first_id, second_id])
    assert job(conn, first_id)["status"] == "running"
    assert job(conn, second_id)["status"] == "cancelled"


def test_registry_lists_live_workers_and_their_slots_as_pods(conn):
    running = [{"job_id": "j1", "task": "slow", "step": None, "workflow_id": None,
                "started_at": "2026-01-01T00:00:00+00:00", "slot": 1}]
    workers.record(conn, worker_info("b", concurrency=3), running)
    workers.record(conn, worker_info("a"), [])
    workers.record(conn, worker_info("stopping"), [])
    workers.stop(conn, "stopping")

    found = live_workers(conn, stale_seconds=10)

    assert [w["name"] for w in found] == ["a", "b"]
    assert found[1]["queues"] == ["default", "mail"] and found[1]["running"] == running
    assert {"host", "pid", "concurrency", "last_seen", "started_at"} <= set(found[0])
    assert pods(conn, stale_seconds=10) == {"total": 5, "available": 4, "leased": ["b/slot-1"]}
    assert registry(conn, "stopping")["status"] == "stopped"


def test_silent_workers_leave_the_live_list_and_are_marked_gone(conn):
    workers.record(conn, worker_info("quiet"), [])
    workers.record(conn, worker_info("chatty"), [])
    conn.execute("UPDATE workers SET last_seen = now() - interval '30 seconds' WHERE name = 'quiet'")

    assert [w["name"] for w in live_workers(conn, stale_seconds=10)] == ["chatty"]
    assert workers.mark_gone(conn, stale_seconds=10) == ["quiet"]
    assert registry(conn, "quiet")["status"] == "gone"

    workers.record(conn, worker_info("quiet"), [])  # it was only slow: the next tick brings it back
    assert registry(conn, "quiet")["status"] == "running"
    assert workers.mark_gone(conn, stale_seconds=10) == []


@contextlib.contextmanager
def round_trips(conn: psycopg.Connection, path: Path):
    """What the connection sends, one entry per round trip: a simple query's text, or "extended"
    (Parse/Bind/Execute up to a Sync: one statement with parameters)."""
    trips: list[str] = []
    with open(path, "w") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield trips
        finally:
            conn.pgconn.untrace()
    for line in path.read_text().splitlines():  # a message is "F|B <tab> length <tab> type..."
        side, _, kind, *rest = line.split("\t") + ["", ""]
        if side == "F" and kind == "Query":
            trips.append(rest[0].strip().strip('"'))
        elif side == "F" and kind == "Sync":
            trips.append("extended")


@pytest.fixture
def worker(db_url: str):
    made = Worker(db_url, name="w1", queues=["default"], concurrency=4)
    yield made
    made.db_thread.shutdown()
    made.task_threads.shutdown()


def test_a_worker_claims_alone_in_one_round_trip_and_reports_in_one_transaction(conn, db_url, worker, tmp_path):
    add_jobs(conn, *[{"task": "echo"}] * 3)
    with connect(db_url, "test-worker") as wconn:
        plan_generically(wconn)
        with round_trips(wconn, tmp_path / "claim") as trips:
            *_, claimed = worker._exchange_sync(wconn, [], [], 2)
        assert len(claimed) == 2 and trips == ["extended"]  # no BEGIN, SET LOCAL or COMMIT

        with round_trips(wconn, tmp_path / "exchange") as trips:
            done, failed, _, more = worker._exchange_sync(
                wconn, [reporting.succeeded(j, {"n": 1}) for j in claimed], [], 2)
        # the completions and the claim in one transaction, without savepoints
        assert trips == ["BEGIN", "extended", "extended", "COMMIT"]
        assert sorted(done.accepted) == sorted(j.id for j in claimed) and not failed.accepted
        assert len(more) == 1
        assert wconn.execute("SHOW plan_cache_mode").fetchone()[0] == "force_generic_plan"
    assert [job(conn, j.id)["status"] for j in claimed] == ["succeeded", "succeeded"]
    assert job(conn, more[0].id)["status"] == "running"


def test_a_refused_report_rolls_the_exchange_back_and_it_is_written_again_report_by_report(conn, db_url, worker):
    add_jobs(conn, *[{"task": "echo"}] * 3)
    with connect(db_url, "test-worker") as wconn:
        plan_generically(wconn)
        *_, claimed = worker._exchange_sync(wconn, [], [], 2)
        good, bad = claimed
        reports = [reporting.succeeded(good, {"n": 1}), reporting.succeeded(bad, {"text": "a\u0000b"})]
        done, failed, written, more = worker._exchange_sync(wconn, reports, [], 1)
        assert wconn.info.transaction_status == pq.TransactionStatus.IDLE
    assert done.accepted == [good.id] and failed.accepted == [bad.id] and len(more) == 1
    assert job(conn, good.id)["status"] == "succeeded"
    assert "result could not be stored" in job(conn, bad.id)["last_error"]
    # each claimed once: the rolled-back first try claimed nothing that stayed claimed
    assert job(conn, more[0].id)["attempts"] == 1
    assert [e.type for e in history(conn, more[0].id)] == ["Enqueued", "Claimed"]


def test_the_hot_path_builders_make_the_same_objects_as_the_constructors() -> None:
    """claim builds its ClaimedJob from a row at once (_make): a row must still fill every field,
    no more, no fewer (a field added to ClaimedJob without a column fails here); the records stay
    read-only."""
    from uuid import uuid4

    from qforge.commands.claim import ClaimedJob, _claimed
    from qforge.commands.report import Report
    from qforge.workers.reporting import succeeded

    row = (uuid4(), "task", "queue", {"a": 1}, 2, 3.5, uuid4(), "step", {"k": "v"}, {"traceparent": "x"})
    job = _claimed(row)
    assert job == ClaimedJob(*row) and job._asdict() == dict(zip(ClaimedJob._fields, row))
    with pytest.raises(TypeError):
        _claimed(row[:-1])
    with pytest.raises(AttributeError):
        job.attempt = 3
    report = succeeded(job, {"out": 1})
    assert report == Report(job.id, job.attempt, result={"out": 1}, workflow_id=job.workflow_id)
    assert (report.error, report.reason) == (None, "error")


def test_the_workers_task_context_fills_every_field(db_url) -> None:
    """The worker makes each job's TaskContext without its __init__: every field must still be
    there, as the constructor would set it (a field added to TaskContext without it fails here)."""
    import dataclasses
    from uuid import uuid4

    from qforge.commands.claim import _claimed
    from qforge.workers.tasks import TaskContext

    worker = Worker(db_url, name="ctx", queues=["default"], concurrency=1)
    try:
        job = _claimed((uuid4(), "task", "queue", {}, 2, 3.5, uuid4(), "step", {}, None))
        ctx = worker._context(job)
        made = TaskContext(job_id=job.id, attempt=2, task="task", queue="queue", workflow_id=job.workflow_id,
                           step="step", timeout_seconds=3.5, allow_shell=worker.allow_shell,
                           policy=worker.task_policy)
        assert vars(ctx) == vars(made) and ctx == made
        assert set(vars(ctx)) == {f.name for f in dataclasses.fields(TaskContext)}
        with pytest.raises(dataclasses.FrozenInstanceError):
            ctx.attempt = 3
    finally:
        worker.db_thread.shutdown()
        worker.task_threads.shutdown()
        worker.history_thread.shutdown()
