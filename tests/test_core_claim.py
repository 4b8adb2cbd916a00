"""Claiming: concurrent-safe, batched, ordered by priority then run_at, respecting delays."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone

from qforge.commands.claim import claim
from qforge.commands.enqueue import JobSpec, enqueue
from qforge.db import connect
from tests.factories import claim_one, count, make_job

JOBS = 10_000
THREADS = 16


def _enqueue_many(conn, n: int) -> None:
    for start in range(0, n, 1000):
        enqueue(conn, [JobSpec(task="echo", payload={"i": i})
                       for i in range(start, min(n, start + 1000))])


def _race(db_url: str, threads: int, batch: int) -> list:
    claimed: list[list] = [[] for _ in range(threads)]
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def run(slot: int) -> None:
        try:
            with connect(db_url, autocommit=True) as conn:
                barrier.wait()
                while True:
                    got = claim(conn, ["default"], batch, f"t{slot}")
                    if not got:
                        return
                    claimed[slot].extend(job.id for job in got)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    assert not errors, errors
    return claimed


def test_sixteen_threads_claim_ten_thousand_jobs_exactly_once(conn, db_url):
    _enqueue_many(conn, JOBS)
    claimed = _race(db_url, THREADS, batch=25)
    ids = [job_id for per_thread in claimed for job_id in per_thread]
    assert len(ids) == JOBS
    assert len(set(ids)) == JOBS, "a job was claimed twice"
    assert sum(1 for per_thread in claimed if per_thread) > 1, "no concurrency happened"
    assert count(conn, "SELECT count(*) FROM events WHERE type = 'Claimed'") == JOBS
    assert count(conn, "SELECT count(*) FROM (SELECT stream_id FROM events WHERE type = 'Claimed'"
                       " GROUP BY stream_id HAVING count(*) > 1) d") == 0
    assert count(conn, "SELECT count(*) FROM jobs WHERE status = 'pending'") == 0
    assert count(conn, "SELECT count(*) FROM jobs WHERE status = 'running' AND attempts = 1") == JOBS


CLAIMER = """
import json, sys
from qforge.commands.claim import claim
from qforge.db import connect
ids = []
with connect(sys.argv[1], autocommit=True) as conn:
    print("ready", flush=True)
    sys.stdin.readline()
    while True:
        got = claim(conn, ["default"], 20, sys.argv[2])
        if not got:
            break
        ids.extend(str(j.id) for j in got)
print(json.dumps(ids))
"""


def test_two_processes_claim_each_job_once(conn, db_url):
    _enqueue_many(conn, 3000)
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, db_url, f"p{i}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for i in range(2)]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:  # start both at once
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = [json.loads(proc.communicate(timeout=120)[0].splitlines()[-1]) for proc in procs]
    finally:
        for proc in procs:
            proc.kill() if proc.poll() is None else None
    ids = results[0] + results[1]
    assert len(ids) == 3000 and len(set(ids)) == 3000
    assert count(conn, "SELECT count(*) FROM events WHERE type = 'Claimed'") == 3000


def test_higher_priority_runs_first_then_earlier_run_at(conn):
    base = datetime.now(timezone.utc) - timedelta(minutes=5)
    low = make_job(conn, priority=0, run_at=base)
    high_late = make_job(conn, priority=5, run_at=base + timedelta(seconds=2))
    high_early = make_job(conn, priority=5, run_at=base + timedelta(seconds=1))
    order = [job.id for job in claim(conn, ["default"], 10, "w")]
    assert order == [high_early, high_late, low]


def test_delayed_job_is_not_claimed_before_its_run_at(conn):
    now = datetime.now(timezone.utc)
    delayed = make_job(conn, delay_seconds=60, now=now)
    assert claim(conn, ["default"], 10, "w", now=now + timedelta(seconds=59)) == []
    assert claim_one(conn, now=now + timedelta(seconds=61)).id == delayed


def test_claim_only_takes_from_the_named_queues(conn):
    emails = make_job(conn, queue="emails")
    make_job(conn, queue="reports")
    got = claim(conn, ["emails", "default"], 10, "w")
    assert [job.id for job in got] == [emails]


def test_batch_claim_respects_limit_and_returns_what_a_worker_needs(conn):
    for i in range(5):
        make_job(conn, task="add", payload={"a": i, "b": 1}, timeout_seconds=3, tags={"k": "v"})
    got = claim(conn, ["default"], 3, "w")
    assert len(got) == 3
    assert all(job.attempt == 1 and job.task == "add" and job.timeout_seconds == 3
               and job.tags == {"k": "v"} for job in got)
    assert count(conn, "SELECT count(*) FROM jobs WHERE status = 'pending'") == 2



def test_a_vacuum_clears_claimed_jobs_from_the_indexes_however_large_the_table(conn):
    # 300 claimed jobs leave dead rows in ~7 of the table's ~570 pages: under the 2 % below
    # which a vacuum skips the indexes (PostgreSQL 14+, "index scan bypassed"), leaving the claimed
    # jobs' entries at the front of the claim index for every later claim to walk. With 10M
    # finished jobs that was ~200,000 claimed jobs' entries (0027_jobs_index_cleanup.sql).
    for _ in range(25):
        enqueue(conn, [JobSpec(task="echo", queue="backlog") for _ in range(1000)])
    enqueue(conn, [JobSpec(task="echo") for _ in range(300)])
    while claim(conn, ["default"], 100, "w"):
        pass
    said: list[str] = []
    conn.add_notice_handler(lambda notice: said.append(notice.message_primary or ""))
    conn.execute("VACUUM (VERBOSE) jobs")
    finished = [line for line in said if line.startswith('finished vacuuming') and '.public.jobs"' in line]
    assert count(conn, "SELECT relpages FROM pg_class WHERE relname = 'jobs'") > 50 * 7
    assert len(finished) == 1, said
    assert "index scan bypassed" not in finished[0], finished[0]
