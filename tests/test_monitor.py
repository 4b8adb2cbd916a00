"""The monitor: one leader among many, stale-job recovery, timers and the worker sweep."""

from __future__ import annotations

import signal
from datetime import datetime, timedelta, timezone

from qforge.commands import workers
from qforge.commands.claim import claim
from qforge.commands.workflows import StepSpec, WorkflowSpec, submit
from qforge.projections.workers import live_workers
from qforge.settings import Settings
from qforge.workers.monitor import Monitor
from test_worker_support import (  # noqa: F401  (procs and tasks_dir are fixtures)
    Processes, add_jobs, history, job, kill, procs, registry, scalar, tasks_dir, wait_for)


def recovered_by(conn, job_id) -> str:
    failed = wait_for(lambda: [e for e in history(conn, job_id) if e.type == "Failed"], timeout=10,
                      message="the stale job to be recovered")
    assert [e.data["reason"] for e in failed] == ["heartbeat_timeout"]
    return failed[0].actor


def test_only_the_leader_acts_and_another_monitor_takes_over_when_it_dies(conn, procs: Processes):
    first = procs.monitor()
    first.wait_log("is the leader")
    second = procs.monitor()
    second.wait_log("is waiting")

    first_job, second_job = add_jobs(conn, {"task": "echo"}, {"task": "echo"})
    claim(conn, ["default"], 1, "zombie")  # never heartbeats: stale after QFORGE_STALE_SECONDS
    assert recovered_by(conn, first_job) == f"monitor:{first.default_name}"
    assert "recovered" not in second.log()

    kill(first)  # its connection closes, and with it the advisory lock
    second.wait_log("is the leader")
    claim(conn, ["default"], 1, "zombie")
    assert job(conn, second_job)["worker"] == "zombie"
    assert recovered_by(conn, second_job) == f"monitor:{second.default_name}"

    second.signal(signal.SIGTERM)
    assert second.wait(timeout=5) == 0
    assert "stopped" in second.log()


def test_a_tick_recovers_stale_jobs_fires_timers_and_marks_silent_workers_gone(conn, db_url):
    long_ago = datetime.now(timezone.utc) - timedelta(minutes=5)
    (stale_job,) = add_jobs(conn, {"task": "echo", "max_retries": 0, "run_at": long_ago})
    claim(conn, ["default"], 1, "lost-worker", now=long_ago)
    workflow_id, _ = submit(conn, WorkflowSpec(name="nap", steps=[StepSpec(step="nap", type="sleep", seconds=0)]))
    info = workers.WorkerInfo(name="silent", host="h", pid=1, queues=["default"], concurrency=2,
                              started_at=long_ago)
    workers.record(conn, info, [])
    workers.record(conn, workers.WorkerInfo(**{**info.__dict__, "name": "alive"}), [])
    conn.execute("UPDATE workers SET last_seen = now() - interval '1 minute' WHERE name = 'silent'")

    Monitor(db_url, name="test", settings=Settings(stale_seconds=10)).tick(conn)

    assert job(conn, stale_job)["status"] == "dead"
    assert scalar(conn, "SELECT status FROM workflows WHERE id = %s", workflow_id) == "succeeded"
    assert registry(conn, "silent")["status"] == "gone"
    assert registry(conn, "alive")["status"] == "running"
    assert [w["name"] for w in live_workers(conn, 10)] == ["alive"]
