"""Worker commands and read models without processes: Released hand-backs and the worker registry."""

from __future__ import annotations

from datetime import datetime, timezone

from qforge.commands import workers
from qforge.commands.claim import claim
from qforge.commands.manage import cancel_job
from qforge.commands.report import Report
from qforge.projections.workers import live_workers, pods
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
