"""The log's guarantees hold across its partitions: one event per (stream, version), idempotency keys,
gapless reads through a partition boundary, append-only on every partition, partitions let go only by archive."""

from __future__ import annotations

import threading
from uuid import uuid4

import psycopg
import pytest

from factories import append_raw, count, make_job
from qforge.commands.claim import claim
from qforge.commands.enqueue import JobSpec, enqueue
from qforge.db import connect
from qforge.events import store


def small_partitions(conn, size: int = 100, ahead: int = 4) -> int:
    """New partitions of `size` positions from the next append on; returns where they start.
    (The monitor keeps `ahead` partitions made beyond the next position; the tests call
    log_maintain themselves between bursts bigger than that.)"""
    conn.execute("UPDATE log_settings SET partition_size = %s, partitions_ahead = %s", (size, ahead))
    return count(conn, "SELECT log_close_current()")


def partitions(conn) -> list[tuple[str, int, int, int]]:
    """(name, lower, upper, events in it) of every partition."""
    rows = conn.execute("SELECT partition::text AS name, lower, upper FROM log_partitions()").fetchall()
    return [(r["name"], r["lower"], r["upper"], count(conn, f"SELECT count(*) FROM {r['name']}")) for r in rows]


def test_partitions_are_made_ahead_and_appends_cross_them(conn):
    small_partitions(conn, 100)
    ids = [make_job(conn) for _ in range(5)]
    for _ in range(5):
        enqueue(conn, [JobSpec(task="echo") for _ in range(50)])
        conn.execute("SELECT log_maintain()")
    filled = [p for p in partitions(conn) if p[3] > 0]
    assert len(filled) >= 3, filled
    ahead = [p for p in partitions(conn) if p[1] >= count(conn, "SELECT log_next_position()")]
    assert len(ahead) >= 4  # log_settings.partitions_ahead empty ones beyond the next position
    assert count(conn, "SELECT count(*) FROM events") == 255
    assert all(count(conn, "SELECT count(*) FROM jobs WHERE id = %s", i) == 1 for i in ids)


def test_every_partition_refuses_update_delete_and_truncate(conn):
    small_partitions(conn, 100)
    for _ in range(3):
        enqueue(conn, [JobSpec(task="echo") for _ in range(50)])
        conn.execute("SELECT log_maintain()")
    checked = 0
    for name, _lower, _upper, n in partitions(conn):
        # Row triggers guard rows (an empty partition has none to change); TRUNCATE is
        # refused on every partition, empty or not.
        statements = [f"UPDATE {name} SET actor = 'x'", f"DELETE FROM {name}"] if n else []
        checked += bool(n)
        for statement in [*statements, f"TRUNCATE {name}"]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    assert checked >= 2
    assert count(conn, "SELECT count(*) FROM events") == 150


def test_a_partition_is_detached_or_dropped_only_by_archive(conn):
    small_partitions(conn, 100)
    enqueue(conn, [JobSpec(task="echo") for _ in range(20)])
    name = partitions(conn)[0][0]
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="qforge archive"):
        conn.execute(f"ALTER TABLE events DETACH PARTITION {name}")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="qforge archive"):
        conn.execute(f"DROP TABLE {name}")
    assert name in [p[0] for p in partitions(conn)]


def test_concurrent_appends_of_one_version_in_a_new_partition_keep_one(conn, db_url):
    job_id = make_job(conn)  # version 1 in the first partition
    small_partitions(conn, 100)  # version 2 lands in another one
    outcomes, barrier = [], threading.Barrier(4)

    def run(worker: str) -> None:
        with connect(db_url, autocommit=True) as own:
            barrier.wait()
            try:
                append_raw(own, "job", job_id, 2, "Claimed", {"attempt": 1, "worker": worker})
                outcomes.append("ok")
            except psycopg.errors.UniqueViolation:
                outcomes.append("refused")

    threads = [threading.Thread(target=run, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["ok", "refused", "refused", "refused"]
    assert count(conn, "SELECT count(*) FROM events WHERE stream_id = %s AND version = 2", job_id) == 1
    assert count(conn, "SELECT version FROM jobs WHERE id = %s", job_id) == 2


def test_concurrent_enqueues_with_one_key_across_a_boundary_make_one_job(conn, db_url):
    small_partitions(conn, 100)
    enqueue(conn, [JobSpec(task="echo") for _ in range(95)])  # the key's job lands near the boundary
    results, barrier = [], threading.Barrier(6)

    def run() -> None:
        with connect(db_url, autocommit=True) as own:
            barrier.wait()
            results.append(enqueue(own, [JobSpec(task="echo", idempotency_key="order-7"),
                                         *[JobSpec(task="echo") for _ in range(5)]])[0])

    threads = [threading.Thread(target=run) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({r.id for r in results}) == 1 and sum(r.created for r in results) == 1
    assert count(conn, "SELECT count(*) FROM jobs WHERE idempotency_key = 'order-7'") == 1


def test_gapless_reads_through_partition_boundaries_while_writers_append(conn, db_url):
    """Writers append while partitions are closed under them; a reader following the log by
    its (xid, position) cursor sees every event once, none skipped, whatever committed late."""
    small_partitions(conn, 100)
    stop = threading.Event()
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            with connect(db_url, autocommit=True) as own:
                for i in range(40):
                    with own.transaction():
                        enqueue(own, [JobSpec(task="echo", tags={"w": str(n)}) for _ in range(3)])
                        if i % 4 == 0:
                            claim(own, ["default"], 2, f"w{n}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def close() -> None:
        with connect(db_url, autocommit=True) as own:
            while not stop.is_set():
                own.execute("SELECT log_close_current()")
                stop.wait(0.02)

    seen: list[int] = []
    cursor = store.START
    writers = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    closer = threading.Thread(target=close)
    for thread in [*writers, closer]:
        thread.start()
    with connect(db_url, autocommit=True) as reader:
        while any(t.is_alive() for t in writers):
            for event in store.read_after(reader, cursor):
                seen.append(event.position)
                cursor = (event.xid, event.position)
        stop.set()
        closer.join()
        while batch := store.read_after(reader, cursor):
            for event in batch:
                seen.append(event.position)
                cursor = (event.xid, event.position)
    assert not errors, errors
    everything = [row["position"] for row in conn.execute("SELECT position FROM events ORDER BY position")]
    assert len(seen) == len(set(seen)), "an event was read twice"
    assert sorted(seen) == everything, "the reader missed events"
    assert len([p for p in partitions(conn) if p[3] > 0]) >= 4
