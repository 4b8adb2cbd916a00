"""New jobs handed to idle workers (34_wake.sql jobs_hand): the single job's path without a claim.

A worker whose claim came up short waits in job_waiters with its name and its listening
backend's pid. A statement that creates a few plain jobs due now claims them for the
longest-waiting live such worker in its own transaction (Enqueued, then Claimed, one xid) and
notifies its channel with the jobs. Everything else (flow control, workflows, delayed jobs, big
batches, a waiter whose backend is gone, a worker that only wants to be woken) takes the wake
path as before, and the log still replays to the live tables and verifies.
"""

from __future__ import annotations

import asyncio
import json
import threading
from uuid import UUID

import httpx
import psycopg
import pytest
from psycopg import sql

from qforge.audit.verify import verify as audit_verify
from qforge.commands.enqueue import JobSpec, enqueue
from qforge.commands.queues import QueueSettingsSpec, configure_queue
from qforge.commands.report import Report, complete
from qforge.projections.replay import verify as replay_verify
from qforge.settings import Settings
from qforge.workers.worker import Worker
from qforge.workflows import engine
from qforge.commands.specs import WorkflowSpec

from cluster_procs import start_api
from openapi_check import assert_matches
from test_worker_support import procs, role_url, scalar, tasks_dir, wait_for  # noqa: F401  (fixtures)


def _wait_as(conn: psycopg.Connection, listener: psycopg.Connection, *, worker: str | None, slots: int = 4,
             pid: int | None = None) -> str:
    """Make `listener` a waiting worker's listening connection, as a worker does (worker_wait)."""
    channel = f"qforge_wake_{listener.info.backend_pid}"
    listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    listener.execute("LISTEN qforge_jobs")
    conn.execute("INSERT INTO job_waiters (channel, queues, slots, worker, pid) VALUES (%s, %s, %s, %s, %s)",
                 (channel, ["default"], slots, worker, pid or listener.info.backend_pid))
    return channel


def _notes(listener: psycopg.Connection) -> list[tuple[str, str]]:
    return [(n.channel, n.payload) for n in listener.notifies(timeout=0.3)]


@pytest.fixture
def listener(db_url: str):
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection


def test_a_new_job_is_claimed_for_the_waiting_worker_in_the_enqueues_transaction(db_url, conn, listener) -> None:
    channel = _wait_as(conn, listener, worker="idle-1")
    with psycopg.connect(role_url(db_url, "api"), autocommit=True) as api:  # the API's role appends no Claimed
        job_id = enqueue(api, [JobSpec(task="echo", payload={"n": 1}, tags={"order": "7"})], actor="api")[0].id
    events = conn.execute("SELECT type, version, actor, data, xid::text AS xid FROM events WHERE stream_id = %s"
                          " ORDER BY version", (job_id,)).fetchall()
    assert [(e["type"], e["version"]) for e in events] == [("Enqueued", 1), ("Claimed", 2)]
    assert events[1]["actor"] == "idle-1" and events[1]["data"] == {"attempt": 1}
    assert events[0]["xid"] == events[1]["xid"]
    row = conn.execute("SELECT status, worker, attempts FROM jobs WHERE id = %s", (job_id,)).fetchone()
    assert row == {"status": "running", "worker": "idle-1", "attempts": 1}
    assert scalar(conn, "SELECT count(*) FROM job_waiters") == 0  # the row was taken
    [(heard, payload)] = _notes(listener)
    assert heard == channel
    [item] = json.loads(payload)
    assert {k: item[k] for k in ("id", "task", "queue", "payload", "attempt", "tags", "step")} == {
        "id": str(job_id), "task": "echo", "queue": "default", "payload": {"n": 1}, "attempt": 1,
        "tags": {"order": "7"}, "step": None}
    # the worker's report is fenced by the handed attempt like any claim's
    assert complete(conn, [Report(job_id, 1, result={"ok": True})], actor="idle-1").accepted == [job_id]
    assert replay_verify(conn) == []
    assert audit_verify(conn).holds


def test_a_big_payload_is_named_by_id_only(conn, listener) -> None:
    _wait_as(conn, listener, worker="idle-1")
    job_id = enqueue(conn, [JobSpec(task="echo", payload={"text": "x" * 9000})], actor="api")[0].id
    [(_, payload)] = _notes(listener)
    assert [item["id"] for item in json.loads(payload)] == [str(job_id)]
    assert "task" not in json.loads(payload)[0]
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", job_id) == "running"


@pytest.mark.parametrize("case", ["paused queue", "rate-limited queue", "concurrency key", "fairness key",
                                  "delayed", "17 at once", "backend gone", "wake only"])
def test_jobs_that_are_not_handed_take_the_wake_path(db_url, conn, listener, case: str) -> None:
    spec = {"task": "echo"}
    count = 1
    if case == "paused queue":
        configure_queue(conn, "default", QueueSettingsSpec(paused=True))
    elif case == "rate-limited queue":
        configure_queue(conn, "default", QueueSettingsSpec(rate_per_second=100.0))
    elif case == "concurrency key":
        spec.update(concurrency_key="k", concurrency_limit=1)
    elif case == "fairness key":
        spec["fairness_key"] = "tenant"
    elif case == "delayed":
        spec["delay_seconds"] = 60
    elif case == "17 at once":
        count = 17
    gone = None
    if case == "backend gone":
        with psycopg.connect(db_url, autocommit=True) as other:
            gone = other.info.backend_pid
        wait_for(lambda: not scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", gone),
                 timeout=10, message="the closed connection's backend to end")
    channel = _wait_as(conn, listener, worker=None if case == "wake only" else "idle-1", pid=gone)
    ids = [r.id for r in enqueue(conn, [JobSpec(**spec) for _ in range(count)], actor="api")]
    assert not scalar(conn, "SELECT count(*) FROM events WHERE type = 'Claimed'")
    assert set(scalar(conn, "SELECT array_agg(DISTINCT status) FROM jobs WHERE id = ANY(%s)", ids)) == {"pending"}
    notes = _notes(listener)
    assert notes and not any(payload.startswith("[") for _, payload in notes), notes
    if case in ("17 at once", "wake only"):  # woken by name, to claim the jobs itself
        assert (channel, "default") in notes
    if case == "backend gone":  # the dead row is dropped, not handed to; the others are woken
        assert scalar(conn, "SELECT count(*) FROM job_waiters") == 0
        assert ("qforge_jobs", "default") in notes


def test_a_waiting_row_whose_backend_is_gone_is_passed_over_when_waking(db_url, conn, listener) -> None:
    with psycopg.connect(db_url, autocommit=True) as other:
        gone = other.info.backend_pid
    wait_for(lambda: not scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", gone),
             timeout=10, message="the closed connection's backend to end")
    conn.execute("INSERT INTO job_waiters (channel, queues, slots, worker, pid) VALUES ('qforge_wake_0', %s, 50,"
                 " NULL, %s)", (["default"], gone))
    channel = _wait_as(conn, listener, worker=None)  # behind the dead row: woken for the 17 jobs
    enqueue(conn, [JobSpec(task="echo") for _ in range(17)], actor="api")
    assert (channel, "default") in _notes(listener)
    assert scalar(conn, "SELECT count(*) FROM job_waiters") == 0


def test_a_workflow_step_is_not_handed(conn, listener) -> None:
    _wait_as(conn, listener, worker="idle-1")
    engine.submit(conn, WorkflowSpec.model_validate({"name": "one", "steps": [{"step": "a", "task": "echo"}]}))
    assert not scalar(conn, "SELECT count(*) FROM events WHERE type = 'Claimed'")


def test_a_worker_without_a_free_slot_hands_the_job_back_and_it_runs(db_url, conn, procs) -> None:  # noqa: F811
    worker = procs.worker("--concurrency", "1", "--tasks", "qf_test_tasks", "--name", "busy", env={"QFORGE_LOG_LEVEL": "DEBUG"})
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM job_waiters WHERE worker = 'busy'"), timeout=30,
             message="the worker to wait for work")
    long_id = enqueue(conn, [JobSpec(task="test_sync_sleep", payload={"seconds": 3})], actor="api")[0].id
    wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", long_id) == "running", timeout=10,
             message="the long job to start")
    # a stale row of the busy worker's (as if it had waited with a slot it has since filled)
    listen_pid = wait_for(lambda: scalar(conn, "SELECT pid FROM pg_stat_activity WHERE application_name ="
                                               " 'qforge-worker busy listen'"), timeout=10, message="its listener")
    conn.execute("INSERT INTO job_waiters (channel, queues, slots, worker, pid) VALUES (%s, %s, 1, 'busy', %s)",
                 (f"qforge_wake_{listen_pid}", ["default"], listen_pid))
    job_id = enqueue(conn, [JobSpec(task="echo", payload={"n": 2})], actor="api")[0].id
    wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", job_id) == "succeeded", timeout=30,
             message="the handed-back job to run")
    types = [r["type"] for r in conn.execute("SELECT type FROM events WHERE stream_id = %s ORDER BY version",
                                             (job_id,)).fetchall()]
    assert types[:3] == ["Enqueued", "Claimed", "Released"] and types[-1] == "Succeeded", types
    assert "handed back 1 jobs" in worker.log()
    assert replay_verify(conn) == []


def test_a_job_enqueued_through_the_api_starts_on_a_waiting_worker(conn, procs) -> None:  # noqa: F811
    procs.worker("--concurrency", "2", "--name", "quick", env={"QFORGE_POLL_INTERVAL_SECONDS": "30"})
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM job_waiters WHERE worker = 'quick'"), timeout=30,
             message="the worker to wait for work")
    _, base = start_api(procs)
    with httpx.Client(base_url=base, timeout=30) as api:
        spec = api.get("/openapi.json").json()
        for n in range(5):
            created = api.post("/jobs", json={"task": "echo", "payload": {"n": n}})
            assert created.status_code == 201, created.text
            assert_matches(spec, "POST", "/jobs", 201, created.json())
            job_id = UUID(created.json()["id"])
            wait_for(lambda: api.get(f"/jobs/{job_id}").json()["status"] == "succeeded", timeout=10,
                     message="the job to run", interval=0.01)
            events = api.get(f"/jobs/{job_id}/events")
            assert_matches(spec, "GET", "/jobs/{job_id}/events", 200, events.json())
            assert [e["type"] for e in events.json()["events"]] == ["Enqueued", "Claimed", "Succeeded"]
            assert events.json()["events"][1]["actor"] == "quick"
            wait_for(lambda: scalar(conn, "SELECT count(*) FROM job_waiters WHERE worker = 'quick'"), timeout=10,
                     message="the worker to wait again", interval=0.01)
    claimed = conn.execute("SELECT count(*) AS n, count(*) FILTER (WHERE c.xid = e.xid) AS same FROM events e"
                           " JOIN events c ON c.stream_id = e.stream_id AND c.type = 'Claimed'"
                           " WHERE e.type = 'Enqueued'").fetchone()
    assert claimed == {"n": 5, "same": 5}
    assert replay_verify(conn) == []


def test_a_job_handed_while_the_worker_claims_finds_the_claims_slot_taken(db_url, conn, listener) -> None:
    """The slots a claim may fill are the worker's before its round trip: a job handed meanwhile is
    handed back, not started in a slot the claim then fills as well (CI, stop 40: IndexError)."""
    first = enqueue(conn, [JobSpec(task="echo", payload={"n": 1})], actor="api")[0].id  # nobody waits: pending
    _wait_as(conn, listener, worker="racing", slots=1)
    second = enqueue(conn, [JobSpec(task="echo", payload={"n": 2})], actor="api")[0].id  # handed to "racing"
    [(_, payload)] = _notes(listener)
    worker = Worker(db_url, name="racing", queues=["default"], concurrency=1,
                    settings=Settings(database_url=db_url, api_token=None))

    async def race() -> None:
        worker.wake = asyncio.Event()
        gate = threading.Event()
        worker.db_thread.submit(gate.wait)  # the claim's round trip is under way, not yet answered
        claiming = asyncio.create_task(worker._exchange(1))
        await asyncio.sleep(0)
        worker._handed(payload)  # the hand lands during the claim
        gate.set()
        await claiming
        await asyncio.gather(*worker.passing)
        await asyncio.gather(*(run.task for run in list(worker.running.values())))

    try:
        asyncio.run(race())
        worker.db.close()
    finally:
        worker.db_thread.shutdown()
        worker.task_threads.shutdown()
    assert worker.free_slots == [0] and [r.job_id for r in worker.completions] == [first]
    types = [r["type"] for r in conn.execute("SELECT type FROM events WHERE stream_id = %s ORDER BY version",
                                             (second,)).fetchall()]
    assert types == ["Enqueued", "Claimed", "Released"]
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", second) == "pending"
    assert replay_verify(conn) == []
