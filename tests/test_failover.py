"""A real failover: the primary is SIGKILLed mid-drain and its synchronous standby promoted.

The API, the monitor and 3 workers all run on the multi-host URL and find the
new primary by themselves; a client enqueues through the API and retries what
the failover makes it retry; an SSE subscriber stays connected throughout.
Run with `-s` to see the figures.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from datetime import datetime, timezone

import psycopg
import pytest

from cluster_procs import DBNAME, RetryingClient, cluster, log_dir, start_api  # noqa: F401  (fixture)
from pgcluster import Cluster
from test_sse import SSEReader
from test_worker_support import QFORGE, Processes, succeeded_counts, tasks_dir, wait_for  # noqa: F401

JOBS = 5_000
WORKFLOWS = 6
KILL_AT_SUCCEEDED = 2_000
CLIENT_THREADS = 4


def test_failover_to_a_synchronous_standby_loses_nothing_and_runs_nothing_twice(
        cluster: Cluster, tmp_path, tasks_dir):
    standby = cluster.standbys[0]
    url = cluster.multi_host_url(DBNAME)
    processes = Processes(url, log_dir(tmp_path), tasks_dir)
    reader = None
    clients: list[RetryingClient] = []
    threads: list[threading.Thread] = []
    stop = threading.Event()  # the test failed early: the enqueuing threads leave
    failures: list[BaseException] = []
    try:
        api, base = start_api(processes)
        processes.monitor()
        workers = [processes.worker("--concurrency", "8") for _ in range(3)]
        reader = SSEReader(base, params={"after": "0"})

        acknowledged: dict[int, str] = {}
        workflows: list[str] = []
        setup = RetryingClient(base)
        clients.append(setup)
        for n in range(WORKFLOWS):
            response = setup.request("POST", "/workflows", json={
                "name": f"failover-{n}", "idempotency_key": f"failover-wf-{n}", "steps": [
                    {"step": "a", "task": "echo", "payload": {"n": n}},
                    {"step": "b", "task": "echo", "depends_on": ["a"]},
                    {"step": "c", "task": "echo", "depends_on": ["a"]},
                    {"step": "d", "task": "echo", "depends_on": ["b", "c"]}]})
            assert response.status_code in (200, 201), response.text
            workflows.append(response.json()["id"])

        def enqueue(part: int) -> None:
            client = RetryingClient(base)
            clients.append(client)
            try:
                for n in range(part, JOBS, CLIENT_THREADS):
                    if stop.is_set():
                        return
                    response = client.request("POST", "/jobs", json={
                        "task": "echo", "payload": {"n": n}, "idempotency_key": f"failover-job-{n}"})
                    assert response.status_code in (200, 201), response.text
                    acknowledged[n] = response.json()["id"]
            except Exception as exc:  # reported by the main thread (a thread's exception would be lost)
                if not stop.is_set():
                    failures.append(exc)

        threads = [threading.Thread(target=enqueue, args=(part,)) for part in range(CLIENT_THREADS)]
        for thread in threads:
            thread.start()

        def succeeded_on_standby() -> bool:
            # The synchronous standby sees what the primary acknowledged: watch there.
            with psycopg.connect(standby.url(DBNAME), autocommit=True) as look:
                return look.execute("SELECT count(*) FROM jobs WHERE status = 'succeeded'"
                                    ).fetchone()[0] >= KILL_AT_SUCCEEDED

        wait_for(succeeded_on_standby, timeout=300, message=f"{KILL_AT_SUCCEEDED} jobs to succeed",
                 interval=0.1)
        killed_at = time.time()
        cluster.primary.kill()
        promotion_seconds = standby.promote()

        for thread in threads:
            thread.join(timeout=400)
        assert failures == []
        assert len(acknowledged) == JOBS

        with psycopg.connect(standby.url(DBNAME), autocommit=True) as check:
            def all_done() -> bool:
                return check.execute("SELECT count(*) FILTER (WHERE status = 'succeeded') = count(*)"
                                     " FROM jobs").fetchone()[0] and check.execute(
                    "SELECT count(*) FROM workflows WHERE status = 'succeeded'").fetchone()[0] == WORKFLOWS

            wait_for(all_done, timeout=300, message="every job and workflow to finish", interval=0.2)
            ids = {str(row[0]) for row in check.execute("SELECT id FROM jobs WHERE workflow_id IS NULL")}
            assert set(acknowledged.values()) <= ids, "an acknowledged job is missing"
            assert len(ids) == JOBS, "a retried POST made a second job"
            counts = succeeded_counts(check)
            assert set(counts.values()) == {1}, "a job succeeded twice"
            assert {str(i) for i in counts} >= set(acknowledged.values())
            statuses = dict(check.execute("SELECT id::text, status FROM workflows").fetchall())
            assert statuses == {wf: "succeeded" for wf in workflows}
            [(first_claim,)] = check.execute(
                "SELECT min(occurred_at) FROM events WHERE type = 'Claimed' AND occurred_at > %s",
                (datetime.fromtimestamp(killed_at, timezone.utc),)).fetchall()
            [(duplicates,)] = check.execute(
                "SELECT count(*) - count(DISTINCT position) FROM events").fetchall()
            assert duplicates == 0
            log_order = [row[0] for row in check.execute("SELECT position FROM events ORDER BY xid, position")]

        verify = subprocess.run([str(QFORGE), "replay", "--verify", "--database-url", standby.url(DBNAME)],
                                capture_output=True, text=True, timeout=300)
        assert verify.returncode == 0, verify.stdout + verify.stderr

        # The subscriber's cursor stayed valid on the new primary: every event, once, in log order.
        received: list[int] = []
        deadline = time.monotonic() + 180
        while len(received) < len(log_order) and time.monotonic() < deadline:
            try:
                received.append(reader.messages.get(timeout=1)["json"]["position"])
            except queue.Empty:
                pass
        assert received == log_order

        for worker in workers:
            assert worker.alive()
            worker.wait_log("database back")
        assert api.alive()
        api.wait_log("database unavailable")
        api.wait_log("database back")
        retries = sum(c.retries for c in clients)
        print(f"\nfailover: {JOBS} jobs + {WORKFLOWS} workflows acknowledged, 0 lost, 0 twice; "
              f"{len(log_order)} events streamed once in order; promotion {promotion_seconds:.2f}s; "
              f"kill to first claim on the new primary {first_claim.timestamp() - killed_at:.2f}s; "
              f"client retries {retries}")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=90)
        if reader is not None:
            reader.close()
        for client in clients:
            client.close()
        processes.close()
        print(processes.logs()[-6000:])
