"""Real `qforge worker` processes (and a monitor where jobs must be recovered): drain, crash, cancel, stop."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

from qforge.commands import report
from qforge.db import EmbeddedPostgres
from qforge.migrate import migrate
from qforge.commands.claim import claim
from qforge.commands.manage import cancel_job
from qforge.commands.specs import StepSpec, WorkflowSpec
from qforge.workflows.engine import submit
from qforge.projections.workers import live_workers, pods
from test_worker_support import (  # noqa: F401  (procs and tasks_dir are fixtures)
    QFORGE, STALE_SECONDS, TICK_SECONDS, Processes, add_jobs, count_status, history, job, kill, process_running,
    procs, registry, scalar, statuses, succeeded_counts, tasks_dir, types, wait_for)


def all_finished(conn: psycopg.Connection, ids: list) -> bool:
    return all(s in ("succeeded", "dead") for s in statuses(conn, ids).values())


def test_worker_drains_jobs_with_correct_results(conn, procs: Processes):
    echo_ids = add_jobs(conn, *({"task": "echo", "payload": {"n": n}} for n in range(150)))
    add_ids = add_jobs(conn, *({"task": "add", "payload": {"a": n, "b": 1000}} for n in range(150)))
    odd = dict(zip(["boom", "task_error", "nul", "unknown", "shell", "bad_add"], add_jobs(
        conn,
        {"task": "test_boom", "payload": {"n": 7}, "max_retries": 0},
        {"task": "test_task_error", "max_retries": 0},
        {"task": "test_nul_result", "max_retries": 0},
        {"task": "no_such_task", "max_retries": 0},
        {"task": "shell", "payload": {"command": "echo hi"}, "max_retries": 0},
        {"task": "add", "payload": {"a": "x"}, "max_retries": 0},
    )))
    workflow_id, _ = submit(conn, WorkflowSpec(name="pair", steps=[
        StepSpec(step="a", task="add", payload={"a": 1, "b": 2}),
        StepSpec(step="b", task="echo", depends_on=["a"]),
    ]))
    worker = procs.worker("--concurrency", "8", "--tasks", "qf_test_tasks", "--name", "drainer")
    ids = echo_ids + add_ids + list(odd.values())
    wait_for(lambda: all_finished(conn, ids), timeout=20, message="every job to finish")

    for n, job_id in enumerate(echo_ids):
        row = job(conn, job_id)
        assert (row["status"], row["result"], row["attempts"], row["worker"]) == ("succeeded", {"n": n}, 1, "drainer")
    for n, job_id in enumerate(add_ids):
        assert job(conn, job_id)["result"] == n + 1000
    failed = {name: job(conn, job_id) for name, job_id in odd.items()}
    assert all(row["status"] == "dead" for row in failed.values())
    assert failed["boom"]["last_error"] == "ValueError: boom 7"
    assert failed["task_error"]["last_error"] == "refused politely"
    assert failed["task_error"]["result"] == {"partial": 1}
    assert [e.data["reason"] for e in history(conn, odd["task_error"]) if e.type == "Failed"] == ["invalid_input"]
    assert "result could not be stored" in failed["nul"]["last_error"]
    # issue 29: dead at its first attempt, naming what the worker knows and --tasks
    assert failed["unknown"]["last_error"].startswith("unknown task 'no_such_task': this worker knows ")
    assert "test_boom" in failed["unknown"]["last_error"] and "--tasks" in failed["unknown"]["last_error"]
    assert failed["unknown"]["attempts"] == 1
    assert "--allow-shell" in failed["shell"]["last_error"]
    assert "add needs numbers" in failed["bad_add"]["last_error"]

    wait_for(lambda: scalar(conn, "SELECT status FROM workflows WHERE id = %s", workflow_id) == "succeeded",
             timeout=10, message="the workflow to succeed")
    assert worker.alive()
    assert set(succeeded_counts(conn).values()) == {1}


def test_two_workers_drain_mixed_jobs_each_succeeding_at_most_once(conn, procs: Processes):
    specs = []
    for n in range(5000):
        kind = n % 5
        if kind == 0:
            specs.append({"task": "flaky", "payload": {"fail_times": 1}, "max_retries": 2})  # succeeds on attempt 2
        elif kind == 1:
            specs.append({"task": "flaky", "payload": {"fail_times": 5}, "max_retries": 1})  # dies after 2 attempts
        elif kind == 2:
            specs.append({"task": "add", "payload": {"a": n, "b": 1}})
        else:
            specs.append({"task": "echo", "payload": {"n": n}})
    ids = add_jobs(conn, *specs)
    procs.worker("--concurrency", "4")
    procs.worker("--concurrency", "4")
    wait_for(lambda: count_status(conn, "succeeded") + count_status(conn, "dead") == len(ids), timeout=40,
             message="5,000 jobs to finish")

    with conn.cursor() as cur:
        rows = cur.execute("SELECT id, status, attempts, result FROM jobs").fetchall()
    by_id = {row["id"]: row for row in rows}
    for n, job_id in enumerate(ids):
        row, kind = by_id[job_id], n % 5
        if kind == 0:
            assert (row["status"], row["attempts"], row["result"]) == ("succeeded", 2, {"attempt": 2})
        elif kind == 1:
            assert (row["status"], row["attempts"]) == ("dead", 2)
        elif kind == 2:
            assert (row["status"], row["result"]) == ("succeeded", n + 1)
        else:
            assert (row["status"], row["result"]) == ("succeeded", {"n": n})
    counts = succeeded_counts(conn)
    assert len(counts) == 4000 and set(counts.values()) == {1}
    with conn.cursor() as cur:
        workers = {row["actor"] for row in cur.execute(
            "SELECT DISTINCT actor FROM events WHERE type = 'Claimed'").fetchall()}
    assert len(workers) == 2, "both workers took a share"


def test_sigkilled_worker_job_is_recovered_by_the_monitor_and_completed_elsewhere(conn, procs: Processes):
    procs.monitor()
    (job_id,) = add_jobs(conn, {"task": "slow", "payload": {"seconds": 1.5}})
    first = procs.worker("--concurrency", "1", "--name", "first")
    wait_for(lambda: job(conn, job_id)["worker"] == "first", timeout=10, message="the first worker to claim")
    kill(first)
    killed_at = time.monotonic()
    procs.worker("--concurrency", "1", "--name", "second")

    wait_for(lambda: any(e.type == "Failed" for e in history(conn, job_id)), timeout=10,
             message="the monitor to recover the job")
    recovered_after = time.monotonic() - killed_at
    assert recovered_after <= STALE_SECONDS + TICK_SECONDS + 1.0  # + startup and polling slack
    wait_for(lambda: job(conn, job_id)["status"] == "succeeded", timeout=10, message="the second worker to finish")

    events = history(conn, job_id)
    assert types(events) == ["Enqueued", "Claimed", "Failed", "Retried", "Claimed", "Succeeded"]
    assert events[2].data["reason"] == "heartbeat_timeout"
    assert [e.data["worker"] for e in events if e.type == "Claimed"] == ["first", "second"]
    assert job(conn, job_id)["result"] == {"slept_seconds": 1.5}


def test_job_that_kills_its_worker_every_attempt_ends_dead(conn, procs: Processes):
    procs.monitor()
    (job_id,) = add_jobs(conn, {"task": "test_suicide", "max_retries": 1})
    worker = None
    deadline = time.monotonic() + 20
    while job(conn, job_id)["status"] != "dead":
        assert time.monotonic() < deadline, "the job never died"
        if worker is None or not worker.alive():
            worker = procs.worker("--concurrency", "2", "--tasks", "qf_test_tasks")
        time.sleep(0.05)

    events = history(conn, job_id)
    assert types(events) == ["Enqueued", "Claimed", "Failed", "Retried", "Claimed", "Failed", "DeadLettered"]
    assert [e.data["reason"] for e in events if e.type == "Failed"] == ["heartbeat_timeout"] * 2
    assert len({e.data["worker"] for e in events if e.type == "Claimed"}) == 2  # each attempt killed a worker


def test_zombie_completion_after_recovery_is_rejected(conn, procs: Processes):
    (job_id,) = add_jobs(conn, {"task": "echo", "payload": {"from": "payload"}})
    (zombie,) = claim(conn, ["default"], 1, "zombie")  # claims, then never heartbeats
    procs.monitor()
    procs.worker("--concurrency", "2", "--name", "real")
    wait_for(lambda: job(conn, job_id)["status"] == "succeeded", timeout=15, message="the real worker to finish")

    outcome = report.complete(conn, [report.Report(job_id, zombie.attempt, result={"from": "zombie"})],
                              actor="zombie")
    assert outcome.rejected == [job_id] and outcome.accepted == []
    row = job(conn, job_id)
    assert (row["status"], row["result"], row["worker"]) == ("succeeded", {"from": "payload"}, "real")
    events = history(conn, job_id)
    assert types(events) == ["Enqueued", "Claimed", "Failed", "Retried", "Claimed", "Succeeded"]
    assert events[2].data["reason"] == "heartbeat_timeout"


def test_job_past_its_timeout_fails_with_reason_timeout(conn, procs: Processes):
    (job_id,) = add_jobs(conn, {"task": "slow", "payload": {"seconds": 30}, "timeout_seconds": 0.5,
                                "max_retries": 0})
    procs.worker("--concurrency", "1")
    wait_for(lambda: job(conn, job_id)["status"] == "dead", timeout=10, message="the job to time out")
    failed = [e for e in history(conn, job_id) if e.type == "Failed"]
    assert [e.data["reason"] for e in failed] == ["timeout"]
    assert "timed out after 0.5s" in failed[0].data["error"]


def test_cancelled_running_jobs_are_stopped_and_not_reported(conn, procs: Processes):
    marker = f"61.{time.time_ns() % 10**9}"
    slow_id, shell_id = add_jobs(conn, {"task": "slow", "payload": {"seconds": 30}},
                                 {"task": "shell", "payload": {"command": f"sleep {marker} & sleep {marker}"}})
    procs.worker("--concurrency", "2", "--name", "canceller", "--allow-shell")
    wait_for(lambda: len((registry(conn, "canceller") or {}).get("running", [])) == 2, timeout=10,
             message="both jobs running")
    wait_for(lambda: process_running(marker), timeout=5, message="the shell command to start")
    cancel_job(conn, slow_id, actor="test")
    cancel_job(conn, shell_id, actor="test")

    wait_for(lambda: registry(conn, "canceller")["running"] == [], timeout=5,
             message="the worker to stop both jobs")
    wait_for(lambda: not process_running(marker), timeout=5, message="the shell command's processes to die")
    (echo_id,) = add_jobs(conn, {"task": "echo"})  # the slots are free again
    wait_for(lambda: job(conn, echo_id)["status"] == "succeeded", timeout=5, message="the next job to run")
    for job_id in (slow_id, shell_id):
        assert job(conn, job_id)["status"] == "cancelled"
        assert types(history(conn, job_id)) == ["Enqueued", "Claimed", "Cancelled"]


def test_sigterm_lets_short_jobs_finish_and_hands_back_the_rest(conn, procs: Processes):
    short_id, long_id, thread_id = add_jobs(
        conn, {"task": "slow", "payload": {"seconds": 0.8}},
        {"task": "test_sleep_first_attempt", "payload": {"seconds": 30}, "max_retries": 0},
        {"task": "test_sync_sleep", "payload": {"seconds": 30}})  # a thread nobody can interrupt
    worker = procs.worker("--concurrency", "3", "--name", "stopper", "--tasks", "qf_test_tasks",
                          env={"QFORGE_SHUTDOWN_GRACE_SECONDS": "1.5"})
    wait_for(lambda: set(statuses(conn, [short_id, long_id, thread_id]).values()) == {"running"},
             timeout=10, message="all three jobs running")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0  # without waiting for the abandoned thread

    assert job(conn, short_id)["status"] == "succeeded"
    assert (job(conn, thread_id)["status"], job(conn, thread_id)["free_attempts"]) == ("pending", 1)
    cancel_job(conn, thread_id, actor="test")  # not to be run again below
    row = job(conn, long_id)
    assert (row["status"], row["attempts"], row["free_attempts"]) == ("pending", 1, 1)
    released = history(conn, long_id)[-1]
    assert (released.type, released.data) == ("Released", {"attempt": 1, "reason": "shutdown"})
    stopped = registry(conn, "stopper")
    assert (stopped["status"], stopped["running"]) == ("stopped", [])
    assert live_workers(conn, STALE_SECONDS) == []

    # Released did not use up the attempt: with max_retries=0 the job still runs again.
    procs.worker("--concurrency", "1", "--tasks", "qf_test_tasks")
    wait_for(lambda: job(conn, long_id)["status"] == "succeeded", timeout=10, message="the released job to rerun")
    assert job(conn, long_id)["result"] == {"attempt": 2}


def test_sigterm_during_a_drain_loses_nothing(conn, procs: Processes):
    ids = add_jobs(conn, *({"task": "slow", "payload": {"seconds": 0.02}} for _ in range(600)))
    first = procs.worker("--concurrency", "8")
    wait_for(lambda: count_status(conn, "succeeded") >= 100, timeout=10, message="the drain to get going")
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=10) == 0
    assert count_status(conn, "running") == 0  # finished or handed back, none left claimed
    procs.worker("--concurrency", "8")
    wait_for(lambda: count_status(conn, "succeeded") == len(ids), timeout=15, message="every job to succeed")
    assert set(succeeded_counts(conn).values()) == {1}


def test_registry_and_pods_show_live_workers_and_their_busy_slots(conn, procs: Processes):
    slow_ids = add_jobs(conn, *({"task": "slow", "payload": {"seconds": 30}} for _ in range(3)))
    procs.worker("--concurrency", "4", "--name", "w-a", "--queues", "default,other")
    procs.worker("--concurrency", "2", "--name", "w-b", "--queues", "other")
    wait_for(lambda: len(live_workers(conn, STALE_SECONDS)) == 2, timeout=10, message="two live workers")
    wait_for(lambda: pods(conn, STALE_SECONDS)["available"] == 3, timeout=10, message="three busy slots")

    found = {w["name"]: w for w in live_workers(conn, STALE_SECONDS)}
    assert found["w-a"]["queues"] == ["default", "other"] and found["w-a"]["concurrency"] == 4
    assert {r["job_id"] for r in found["w-a"]["running"]} == {str(i) for i in slow_ids}
    assert {r["task"] for r in found["w-a"]["running"]} == {"slow"}
    assert found["w-b"]["running"] == []
    assert pods(conn, STALE_SECONDS) == {"total": 6, "available": 3,
                                         "leased": ["w-a/slot-0", "w-a/slot-1", "w-a/slot-2"]}






@pytest.fixture
def own_server() -> Iterator[tuple[EmbeddedPostgres, Path, str]]:
    """A migrated PostgreSQL of this test alone, so the test may restart it: (server, pgdata, url)."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else "/var/tmp"  # never under /root (see app/db.py)
    folder = Path(tempfile.mkdtemp(prefix="qforge-restart-", dir=base))
    server = EmbeddedPostgres()
    try:
        url = server.start(folder / "pgdata", cleanup_mode="stop")
        with psycopg.connect(url, autocommit=True) as admin:
            migrate(admin)
        yield server, folder / "pgdata", url
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_postgres_restart_during_a_drain_completes_every_job_exactly_once(own_server, tmp_path, tasks_dir):
    server, pgdata, url = own_server

    def count(status: str) -> int:
        # A fresh connection per look: the server goes away in the middle.
        with psycopg.connect(url, autocommit=True) as look:
            return scalar(look, "SELECT count(*) FROM jobs WHERE status = %s", status)

    with psycopg.connect(url, autocommit=True) as setup:
        ids = add_jobs(setup, *({"task": "slow", "payload": {"seconds": 0.02}} for _ in range(2000)))
    processes = Processes(url, tmp_path, tasks_dir)
    try:
        monitor = processes.monitor()
        workers = [processes.worker("--concurrency", "8"), processes.worker("--concurrency", "8")]
        wait_for(lambda: count("succeeded") >= 300, timeout=10, message="the drain to get going")
        server.stop()  # a fast shutdown: every session is terminated
        for worker in workers:
            worker.wait_log("database unavailable", timeout=5)
        time.sleep(1.0)  # not a wait for anything: how long PostgreSQL stays down
        assert server.start(pgdata, cleanup_mode="stop") == url

        wait_for(lambda: count("succeeded") == len(ids), timeout=30, message="every job to succeed")
        with psycopg.connect(url, autocommit=True) as check:
            assert set(succeeded_counts(check).values()) == {1}
            for worker in workers:
                worker.wait_log("database back")
                assert worker.alive()
            # The monitor reconnected and leads again: it recovers a job orphaned after the restart.
            (orphan_id,) = add_jobs(check, {"task": "echo", "queue": "nobody"})
            claim(check, ["nobody"], 1, "zombie")
            wait_for(lambda: job(check, orphan_id)["status"] == "pending", timeout=10,
                     message="the monitor to recover the orphan")
        assert monitor.log().count("is the leader") == 2
        assert "recovering stale jobs again in 2s" in monitor.log()  # workers get time to beat again first
    finally:
        processes.close()
        print(processes.logs())


def test_worker_exits_with_a_message_on_a_broken_task_module(db_url):
    # (An unmigrated database is waited for: tests/test_migrate.py.)
    broken = subprocess.run([str(QFORGE), "worker", "--database-url", db_url, "--tasks", "no_such_module_here"],
                            capture_output=True, text=True, timeout=30)
    assert broken.returncode == 2 and "cannot load task module 'no_such_module_here'" in broken.stderr


def test_a_short_backoff_is_honoured_not_rounded_up_to_the_poll_interval(conn, procs: Processes):
    procs.worker("--concurrency", "2", env={"QFORGE_POLL_INTERVAL_SECONDS": "30",
                                            "QFORGE_BACKOFF_BASE_SECONDS": "0.05"})
    [job_id] = add_jobs(conn, {"task": "flaky", "payload": {"fail_times": 2}, "max_retries": 3})
    wait_for(lambda: statuses(conn, [job_id])[job_id] == "succeeded", timeout=10,
             message="the flaky job to succeed through its retries")
    events = history(conn, job_id)
    assert types(events) == ["Enqueued", "Claimed", "Failed", "Retried", "Claimed", "Failed",
                             "Retried", "Claimed", "Succeeded"]
    for retried, claimed in zip(events, events[1:]):
        if retried.type == "Retried":
            waited = (claimed.occurred_at - retried.occurred_at).total_seconds()
            assert waited < 2, f"a {retried.data['delay_seconds']:.2f}s backoff took {waited:.2f}s"
