"""The monitor: one leader among many, stale-job recovery, timers and the worker sweep."""

from __future__ import annotations

import signal
from datetime import datetime, timedelta, timezone

from qforge.commands import workers
from qforge.commands.claim import claim
from qforge.commands.specs import StepSpec, WorkflowSpec
from qforge.workflows.engine import submit
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


def test_the_leader_packs_closed_partitions_of_the_log_without_holding_up_its_tick(conn, procs: Processes):
    conn.execute("UPDATE log_settings SET partition_size = 100, partitions_ahead = 4")
    conn.execute("SELECT log_close_current()")
    jobs = add_jobs(conn, *[{"task": "echo"} for _ in range(250)])  # positions 1-250: three partitions
    conn.execute("SELECT log_close_current()")
    before = conn.execute("SELECT * FROM events_after_page('0'::xid8, 0, 1000)").fetchall()

    last = before[-1]["position"]  # (the newest closed partition, within QFORGE_LOG_PACK_KEEP of the head, stays live)
    monitor = procs.monitor({"QFORGE_LOG_PACK_SECONDS": "0.2", "QFORGE_LOG_PACK_DUTY": "1",
                             "QFORGE_LOG_PACK_KEEP": "100"})
    monitor.wait_log("is the leader")
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM log_packs WHERE state = 'packed'") >= 2, timeout=20,
             message="the closed partitions to be packed")
    assert scalar(conn, "SELECT count(*) FROM log_packs") == 2
    assert scalar(conn, "SELECT count(*) FROM events WHERE position = %s", last) == 1
    # The tick went on meanwhile: a job claimed by a worker that never beats is recovered.
    claim(conn, ["default"], 1, "zombie")
    assert recovered_by(conn, jobs[0]) == f"monitor:{monitor.default_name}"

    assert "packed" in monitor.log()
    assert scalar(conn, "SELECT count(*) FROM events_packed") > 0
    assert conn.execute("SELECT * FROM events_after_page('0'::xid8, 0, 1000)").fetchall()[:len(before)] == before
    monitor.signal(signal.SIGTERM)
    assert monitor.wait(timeout=10) == 0
