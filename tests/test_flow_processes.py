"""Flow control with real processes: schedules under two monitors (one killed) and a PostgreSQL
restart, a concurrency limit across workers, a paused queue."""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg
from psycopg.rows import dict_row

from qforge.commands import schedules
from qforge.commands.queues import QueueSettingsSpec, configure_queue
from qforge.commands.schedules import ScheduleSpec
from test_worker_processes import own_server  # noqa: F401  (a fixture)
from test_worker_support import (  # noqa: F401  (procs and tasks_dir are fixtures)
    Processes, add_jobs, kill, procs, scalar, statuses, tasks_dir, wait_for)


def fired_ticks(url_or_conn, name: str) -> list:
    def read(conn):
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT (e.data ->> 'tick')::timestamptz AS tick, (e.data ->> 'execution_id')::uuid AS job"
                        "  FROM events e WHERE e.type = 'ScheduleFired' AND e.data ->> 'tick' IS NOT NULL"
                        "   AND e.stream_id = (SELECT id FROM schedules WHERE name = %s) ORDER BY e.position",
                        [name])
            return cur.fetchall()
    if isinstance(url_or_conn, str):
        with psycopg.connect(url_or_conn, autocommit=True) as conn:
            return read(conn)
    return read(url_or_conn)


def assert_each_tick_once(conn, name: str, at_least: int) -> None:
    """Every second from the first fired tick to the last fired exactly once, each with its own job."""
    fired = fired_ticks(conn, name)
    ticks = [row["tick"] for row in fired]
    assert len(ticks) >= at_least
    assert ticks == [ticks[0] + timedelta(seconds=n) for n in range(len(ticks))], "a tick missed or repeated"
    jobs = scalar(conn, "SELECT count(*) FROM jobs WHERE tags ->> 'schedule' = %s", name)
    assert jobs == len(ticks) == len({row["job"] for row in fired})


def test_two_monitors_fire_120_one_second_ticks_once_each_with_the_leader_killed(conn, procs: Processes):
    schedules.create_schedule(conn, ScheduleSpec(name="tick", cron="* * * * * *", job={"task": "echo"},
                                                 catch_up="none"))
    monitors = [procs.monitor(), procs.monitor()]

    def count() -> int:
        return len(fired_ticks(conn, "tick"))

    wait_for(lambda: count() >= 60, timeout=75, message="60 ticks fired")
    leader = next(m for m in monitors if "is the leader" in m.log())
    kill(leader)  # kill -9 midway: the other monitor takes over and fires the ticks it missed
    wait_for(lambda: count() >= 121, timeout=75, message="120 more ticks... 121 in all")
    schedules.update_schedule(conn, "tick", {"paused": True})
    survivor = next(m for m in monitors if m is not leader)
    assert survivor.alive() and "is the leader" in survivor.log()
    assert_each_tick_once(conn, "tick", at_least=121)


def test_ticks_fire_once_each_across_a_postgres_restart(own_server, tmp_path, tasks_dir):  # noqa: F811
    server, pgdata, url = own_server
    with psycopg.connect(url, autocommit=True) as setup:
        schedules.create_schedule(setup, ScheduleSpec(name="tick", cron="* * * * * *", job={"task": "echo"},
                                                      catch_up="none"))
    processes = Processes(url, tmp_path, tasks_dir)
    try:
        monitors = [processes.monitor(), processes.monitor()]
        wait_for(lambda: len(fired_ticks(url, "tick")) >= 4, timeout=15, message="4 ticks fired")
        server.stop()
        time.sleep(2.0)  # not a wait for anything: how long PostgreSQL stays down (two ticks)
        assert server.start(pgdata, cleanup_mode="stop") == url
        wait_for(lambda: len(fired_ticks(url, "tick")) >= 12, timeout=30, message="ticks fired again")
        with psycopg.connect(url, autocommit=True) as check:
            schedules.update_schedule(check, "tick", {"paused": True})
            assert_each_tick_once(check, "tick", at_least=12)
        assert all(m.alive() for m in monitors)
    finally:
        processes.close()
        print(processes.logs())


def test_concurrency_limit_of_two_holds_across_three_workers_of_eight_slots(conn, procs: Processes):
    keyed = add_jobs(conn, *({"task": "slow", "payload": {"seconds": 0.1}, "concurrency_key": "tenant-1",
                              "concurrency_limit": 2} for _ in range(30)))
    plain = add_jobs(conn, *({"task": "slow", "payload": {"seconds": 0.3}} for _ in range(40)))
    for n in range(3):
        procs.worker("--concurrency", "8", "--name", f"w{n}")
    wait_for(lambda: set(statuses(conn, keyed + plain).values()) == {"succeeded"}, timeout=60,
             message="every job to succeed")
    # Replay the keyed jobs' Claimed and finishing events in log order. A claim takes
    # its key's slot row lock before it appends, so a Claimed that a finish made room
    # for always comes after that finish in the log: position order is the real order.
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT type, occurred_at FROM events WHERE stream_id = ANY(%s)"
                    " AND type IN ('Claimed', 'Succeeded', 'Failed') ORDER BY position", [keyed])
        running = peak = 0
        for row in cur.fetchall():
            running += 1 if row["type"] == "Claimed" else -1
            peak = max(peak, running)
    assert peak == 2  # never more, and the limit was used
    # The plain jobs were not held up behind the key: they ran on the other slots meanwhile.
    first_plain_done = scalar(conn, "SELECT min(finished_at) FROM jobs WHERE id = ANY(%s)", plain)
    last_keyed_done = scalar(conn, "SELECT max(finished_at) FROM jobs WHERE id = ANY(%s)", keyed)
    assert first_plain_done < last_keyed_done


def test_a_paused_queue_runs_nothing_until_resumed(conn, procs: Processes):
    (running,) = add_jobs(conn, {"task": "slow", "payload": {"seconds": 1.5}, "queue": "pq"})
    worker = procs.worker("--queues", "pq,other", "--concurrency", "4")
    wait_for(lambda: statuses(conn, [running])[running] == "running", timeout=10, message="the long job to start")
    configure_queue(conn, "pq", QueueSettingsSpec(paused=True))
    held = add_jobs(conn, *({"task": "echo", "queue": "pq"} for _ in range(5)))
    # The worker keeps serving its other queue while pq is paused ...
    for _ in range(3):
        (other,) = add_jobs(conn, {"task": "echo", "queue": "other"})
        wait_for(lambda: statuses(conn, [other])[other] == "succeeded", timeout=10, message="the other queue")
    # ... and the job that was running when the pause came finishes.
    wait_for(lambda: statuses(conn, [running])[running] == "succeeded", timeout=10, message="the running job")
    (other,) = add_jobs(conn, {"task": "echo", "queue": "other"})
    wait_for(lambda: statuses(conn, [other])[other] == "succeeded", timeout=10, message="the other queue")
    assert set(statuses(conn, held).values()) == {"pending"}
    configure_queue(conn, "pq", QueueSettingsSpec(paused=False))
    wait_for(lambda: set(statuses(conn, held).values()) == {"succeeded"}, timeout=10, message="resumed jobs")
    assert worker.alive()
