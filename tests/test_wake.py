"""The wake path alone: with a 30 s poll, a worker starts jobs because it is told, not because it looks.

A job enqueued through the API while the worker listens starts within 100 ms (LISTEN/NOTIFY);
a delayed job starts within 100 ms of its run_at (the notification names when it comes due and
the worker sets a timer on it). Without either, these jobs would wait for the 30 s poll.
"""

from __future__ import annotations

import re
import statistics
from datetime import datetime, timedelta, timezone
from uuid import UUID

import httpx
import psycopg

from cluster_procs import start_api
from test_worker_support import Processes, procs, scalar, tasks_dir, wait_for  # noqa: F401  (fixtures)

SLOW_POLL = {"QFORGE_POLL_INTERVAL_SECONDS": "30"}
BOUND_MS = 100.0


def _listening(conn: psycopg.Connection, name: str) -> bool:
    """The worker's listener has run LISTEN and its look for delayed jobs, and waits."""
    return bool(scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                             " AND state = 'idle' AND (query LIKE 'LISTEN%%' OR query LIKE '%%run_at > now()%%')",
                       f"qforge-worker {name} listen"))


def _claimed_at(conn: psycopg.Connection, job_id: UUID) -> datetime | None:
    return scalar(conn, "SELECT occurred_at FROM events WHERE stream_id = %s AND type = 'Claimed'"
                        " ORDER BY version LIMIT 1", job_id)


def _enqueued_at(conn: psycopg.Connection, job_id: UUID) -> datetime:
    return scalar(conn, "SELECT occurred_at FROM events WHERE stream_id = %s AND version = 1", job_id)


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def test_a_worker_with_a_30s_poll_starts_new_and_delayed_jobs_when_told(conn: psycopg.Connection,
                                                                        procs: Processes) -> None:
    _, base = start_api(procs)
    with httpx.Client(base_url=base, timeout=30) as api:
        # enqueued before the worker listens (nobody hears its notification): the listener asks
        # for the earliest due job when it connects
        early = api.post("/jobs", json={"task": "echo", "delay_seconds": 8}).json()
        early_due = datetime.fromisoformat(early["run_at"])
        procs.worker("--concurrency", "4", "--name", "waker", env=SLOW_POLL)
        wait_for(lambda: _listening(conn, "waker"), timeout=30, message="the worker to listen")
        assert datetime.now(timezone.utc) < early_due, "the worker took longer to start than the job's delay"

        # 20 jobs, one after the other, each enqueued while the worker waits
        latencies_ms = []
        for _ in range(20):
            job_id = UUID(api.post("/jobs", json={"task": "echo"}).json()["id"])
            claimed = wait_for(lambda: _claimed_at(conn, job_id), timeout=10, message="the job to start",
                               interval=0.005)
            latencies_ms.append((claimed - _enqueued_at(conn, job_id)).total_seconds() * 1000)
            wait_for(lambda: _listening(conn, "waker"), timeout=10, message="the worker to wait again")
        assert _p99(latencies_ms) < BOUND_MS, f"enqueue to start, ms: {sorted(latencies_ms)}"

        # delayed jobs: run_at and delay_seconds, each starting when due, not at the next poll
        late_ms = []
        for n in range(6):
            run_at = datetime.now(timezone.utc) + timedelta(seconds=0.6)
            body = {"task": "echo", "run_at": run_at.isoformat()} if n % 2 else {"task": "echo", "delay_seconds": 0.6}
            created = api.post("/jobs", json=body)
            assert created.status_code == 201, created.text
            job_id = UUID(created.json()["id"])
            due = datetime.fromisoformat(created.json()["run_at"])
            claimed = wait_for(lambda: _claimed_at(conn, job_id), timeout=10, message="the delayed job to start",
                               interval=0.005)
            assert claimed >= due
            late_ms.append((claimed - due).total_seconds() * 1000)
        claimed = wait_for(lambda: _claimed_at(conn, UUID(early["id"])), timeout=20,
                           message="the job enqueued before the worker listened to start", interval=0.005)
        late_ms.append((claimed - early_due).total_seconds() * 1000)
        assert min(late_ms) >= 0 and max(late_ms) < BOUND_MS, f"run_at to start, ms: {late_ms}"
        print(f"wake: enqueue->start p50 {statistics.median(latencies_ms):.1f} ms,"
              f" p99 {_p99(latencies_ms):.1f} ms; run_at->start max {max(late_ms):.1f} ms")


def _claims(workers: list) -> int:
    """Claims the workers made so far, and notifications of jobs handed to them (each logs one line
    per claim or hand at DEBUG)."""
    return sum(len(re.findall(r"claimed \d+ jobs of \d+|took \d+ handed jobs", worker.log_path.read_text()))
               for worker in workers)


def _handed(workers: list) -> int:
    return sum(len(re.findall(r"took \d+ handed jobs", worker.log_path.read_text())) for worker in workers)


def _waiting(conn: psycopg.Connection) -> int:
    return scalar(conn, "SELECT count(*) FROM job_waiters")


def test_a_new_job_wakes_one_idle_worker_and_no_other_claims_in_vain(conn: psycopg.Connection,
                                                                     procs: Processes) -> None:
    _, base = start_api(procs)
    env = {**SLOW_POLL, "QFORGE_LOG_LEVEL": "DEBUG"}
    workers = [procs.worker("--concurrency", "4", "--name", name, env=env) for name in ("one", "two")]
    wait_for(lambda: _waiting(conn) == 2, timeout=30, message="both workers to wait for work")
    before = _claims(workers)
    jobs = 20
    with httpx.Client(base_url=base, timeout=30) as api:
        for _ in range(jobs):
            job_id = UUID(api.post("/jobs", json={"task": "echo"}).json()["id"])
            wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", job_id) == "succeeded",
                     timeout=10, message="the job to run", interval=0.005)
            wait_for(lambda: _waiting(conn) == 2, timeout=10, message="both workers to wait again", interval=0.005)
    claims = _claims(workers) - before
    # one claim or hand per job (a poll or a listener's reconnect may add one); every worker woken
    # by every job makes two per job (40: seen without 34_wake.sql)
    assert jobs <= claims <= jobs + 2, f"{claims} claims for {jobs} jobs"
    # each new job was handed to the waiting worker in the enqueue's transaction (jobs_hand):
    # no claim of the worker's own
    assert _handed(workers) == jobs
    assert scalar(conn, "SELECT count(*) FROM events e JOIN events c ON c.stream_id = e.stream_id"
                        " WHERE e.type = 'Enqueued' AND c.type = 'Claimed' AND c.xid = e.xid") == jobs
    # the longest-waiting worker is served first: they take turns
    assert scalar(conn, "SELECT count(DISTINCT actor) FROM events WHERE type = 'Claimed'") == 2
