"""qforge.enqueue / qforge.submit on the application's own connection: the job exists if and only
if the application's transaction commits."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

import qforge
from qforge.commands.errors import Invalid
from qforge.commands.plan import Last, Statement, run


def job_count(db_url: str, job_id: uuid.UUID | None = None) -> int:
    """Seen from another connection: what is committed."""
    with psycopg.connect(db_url, autocommit=True) as other:
        if job_id is None:
            return other.execute("SELECT count(*) FROM jobs").fetchone()[0]
        return other.execute("SELECT count(*) FROM jobs WHERE id = %s", (job_id,)).fetchone()[0]


@pytest.fixture
def app_db(db_url: str):
    """The application's connection (psycopg's default: not autocommit) and its own table."""
    with psycopg.connect(db_url, autocommit=True) as setup:
        setup.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    with psycopg.connect(db_url) as conn:
        yield conn


def test_job_commits_with_the_callers_transaction(app_db, db_url):
    with app_db.transaction():
        app_db.execute("INSERT INTO orders VALUES (1)")
        job_id = qforge.enqueue(app_db, "send_email", {"order": 1}, tags={"order": "1"})
        assert job_count(db_url, job_id) == 0  # not visible before the commit
    assert job_count(db_url, job_id) == 1


def test_rollback_removes_the_job_even_when_enqueue_is_the_first_statement(app_db, db_url):
    # psycopg's own transaction() would begin AND commit here; the job must wait for the caller.
    job_id = qforge.enqueue(app_db, "send_email", {"order": 2})
    app_db.execute("INSERT INTO orders VALUES (2)")
    app_db.rollback()
    assert job_count(db_url, job_id) == 0
    job_id = qforge.enqueue(app_db, "send_email", {"order": 3})
    app_db.commit()
    assert job_count(db_url, job_id) == 1


def test_exception_inside_the_block_loses_the_job_and_the_business_row(app_db, db_url):
    with pytest.raises(RuntimeError):
        with app_db.transaction():
            app_db.execute("INSERT INTO orders VALUES (4)")
            qforge.enqueue(app_db, "send_email", {"order": 4})
            workflow_id = qforge.submit(app_db, {"name": "ship", "steps": [{"step": "a", "task": "echo"}]})
            raise RuntimeError("payment declined")
    assert job_count(db_url) == 0
    with psycopg.connect(db_url) as other:
        assert other.execute("SELECT count(*) FROM workflows WHERE id = %s", (workflow_id,)).fetchone()[0] == 0
        assert other.execute("SELECT count(*) FROM orders").fetchone()[0] == 0


def test_on_an_autocommit_connection_the_job_commits_at_once(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        job_id = qforge.enqueue(conn, "echo")
    assert job_count(db_url, job_id) == 1


def test_bad_input_is_refused_before_sending_and_the_transaction_stays_usable(app_db, db_url):
    with app_db.transaction():
        app_db.execute("INSERT INTO orders VALUES (5)")
        with pytest.raises(Invalid) as bad:
            qforge.enqueue(app_db, "echo", priority="urgent")
        assert bad.value.details[0]["field"] == "priority"
        with pytest.raises(Invalid):  # the graph is checked too, every problem at once
            qforge.submit(app_db, {"name": "w", "steps": [{"step": "a", "task": "echo", "depends_on": ["x"]}]})
        job_id = qforge.enqueue(app_db, "echo")
    assert job_count(db_url, job_id) == 1
    with psycopg.connect(db_url) as other:
        assert other.execute("SELECT count(*) FROM orders").fetchone()[0] == 1


def test_idempotency_key_returns_the_existing_job(app_db, db_url):
    with app_db.transaction():
        first = qforge.enqueue(app_db, "echo", idempotency_key="order-9")
    with app_db.transaction():
        again = qforge.enqueue(app_db, "echo", {"other": True}, idempotency_key="order-9")
    assert again == first and job_count(db_url) == 1


def test_async_connection_commit_and_rollback(app_db, db_url):
    async def main() -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            async with conn.transaction():
                kept = await qforge.enqueue(conn, "echo", {"n": 1})
                workflow_id = await qforge.submit(conn, {"name": "w", "steps": [{"step": "a", "task": "echo"}]})
            dropped = await qforge.enqueue_async(conn, "echo", {"n": 2})  # first statement: no commit of its own
            await conn.rollback()
            return kept, workflow_id, dropped
    kept, workflow_id, dropped = asyncio.run(main())
    assert job_count(db_url, kept) == 1 and job_count(db_url, dropped) == 0
    with psycopg.connect(db_url) as other:
        assert other.execute("SELECT count(*) FROM jobs WHERE workflow_id = %s", (workflow_id,)).fetchone()[0] == 1


def _started_its_transaction() -> object:
    """A plan of one statement that tells whether it began its own transaction: now() is the
    transaction's start, statement_timestamp() this statement's, equal only for a statement that
    runs by itself (a BEGIN before it is a round trip earlier)."""
    [rows] = yield Last([Statement("SELECT now() = statement_timestamp()", {}, fetch=True)])
    return rows[0][0]


def _started_its_transaction_not_last() -> object:
    [rows] = yield [Statement("SELECT now() = statement_timestamp()", {}, fetch=True)]
    return rows[0][0]


def test_a_last_lone_statement_skips_begin_and_commit_only_where_it_is_atomic_by_itself(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert run(conn, _started_its_transaction()) is True  # no BEGIN/COMMIT round trips
        assert run(conn, _started_its_transaction_not_last()) is False  # a transaction of its own
        with conn.transaction():  # the caller's block: a savepoint inside it, never alone
            assert run(conn, _started_its_transaction()) is False
    with psycopg.connect(db_url) as conn:  # not autocommit: joins or opens a transaction as before
        assert run(conn, _started_its_transaction()) is False
        conn.rollback()


def test_a_one_job_enqueue_on_an_autocommit_connection_is_one_statement_and_commits(db_url):
    from qforge.commands.enqueue import JobSpec, enqueue

    with psycopg.connect(db_url, autocommit=True) as conn:
        [result] = enqueue(conn, [JobSpec(task="noop")], actor="test")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert job_count(db_url, result.id) == 1
    with psycopg.connect(db_url, autocommit=True) as conn:
        events = conn.execute("SELECT type FROM events WHERE stream_id = %s", (result.id,)).fetchall()
    assert events == [("Enqueued",)]


# --------------------------------------------------------------------------- qforge.enqueue_many


def _stored(db_url: str, job_ids: list[uuid.UUID]) -> list[tuple]:
    """What the log and the read model hold of each job, in the order of job_ids, without what
    differs between two enqueues (id, times, positions, hashes)."""
    with psycopg.connect(db_url, autocommit=True) as other:
        rows = other.execute(
            "SELECT e.data, e.tags, e.type, e.version, j.task, j.queue, j.priority, j.max_retries, j.payload,"
            "       j.tags, j.status, j.timeout_seconds, j.concurrency_key, j.concurrency_limit, j.fairness_key,"
            "       nullif(j.run_at, j.created_at)"
            "  FROM unnest(%s::uuid[]) WITH ORDINALITY AS i(id, n) JOIN events e ON e.stream_id = i.id"
            "  JOIN jobs j ON j.id = i.id ORDER BY i.n", (job_ids,)).fetchall()
    assert len(rows) == len(job_ids)
    return rows


def test_enqueue_many_stores_what_enqueue_does_job_by_job_and_replay_and_audit_agree(db_url):
    from qforge.audit.verify import verify
    from qforge.projections import replay

    payloads = [None, {}, {"n": 1, "deep": {"list": [1, "x", None]}}, {"n": 2}] * 200  # 800: four statements
    options = {"queue": "mail", "priority": 5, "max_retries": 1, "timeout_seconds": 30.0,
               "tags": {"tenant": "acme"}, "run_at": "2030-01-02T03:04:05+00:00", "concurrency_key": "k",
               "concurrency_limit": 2,
               "fairness_key": "f"}
    with psycopg.connect(db_url, autocommit=True) as conn:
        batch = qforge.enqueue_many(conn, "send_email", payloads, **options)
        single = [qforge.enqueue(conn, "send_email", payload, **options) for payload in payloads[:4]]
    assert len(batch) == len(set(batch)) == 800 and batch == sorted(batch)  # in order, time-ordered ids
    assert _stored(db_url, batch) == _stored(db_url, single) * 200
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert replay.verify(conn) == []
        assert verify(conn).problems == []


def test_enqueue_many_with_no_options_and_no_payloads_is_a_plain_job_each(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        batch = qforge.enqueue_many(conn, "noop", [None] * 3)
        single = qforge.enqueue(conn, "noop")
        assert qforge.enqueue_many(conn, "noop", []) == []
        delayed = qforge.enqueue_many(conn, "noop", [None, None], delay_seconds=60)
        waits = conn.execute("SELECT extract(epoch FROM run_at - created_at) FROM jobs WHERE id = ANY(%s)",
                             (delayed,)).fetchall()
    assert _stored(db_url, batch) == _stored(db_url, [single]) * 3
    assert [round(wait) for (wait,) in waits] == [60, 60]


def test_enqueue_many_commits_and_rolls_back_with_the_callers_transaction(app_db, db_url):
    with app_db.transaction():
        app_db.execute("INSERT INTO orders VALUES (10)")
        kept = qforge.enqueue_many(app_db, "echo", [{"n": n} for n in range(300)])
        assert job_count(db_url) == 0
    assert job_count(db_url) == 300
    dropped = qforge.enqueue_many(app_db, "echo", [None] * 600)  # the first statement: no commit of its own
    app_db.rollback()
    assert job_count(db_url) == 300 and job_count(db_url, dropped[0]) == 0 and job_count(db_url, kept[-1]) == 1


def test_enqueue_many_refuses_bad_input_naming_the_job_before_sending(app_db, db_url):
    with app_db.transaction():
        app_db.execute("INSERT INTO orders VALUES (11)")
        cases = [
            (([{"n": 1}, [1, 2]],), {}, "payloads.1"),
            (([None, None, {"x": float("nan")}],), {}, "payloads[2].x"),
            (([{"text": "a\x00b"}],), {}, "payloads[0].text"),
            (([None],), {"priority": "urgent"}, "priority"),
            (([None],), {"idempotency_key": "k"}, "idempotency_key"),
            (([None],), {"payload": {"a": 1}}, "payload"),
            (([None],), {"concurrency_key": "k"}, "body"),
        ]
        for args, options, field in cases:
            with pytest.raises(Invalid) as bad:
                qforge.enqueue_many(app_db, "echo", *args, **options)
            assert bad.value.details[0]["field"] == field, (options, bad.value.details)
        with pytest.raises(Invalid) as bad:
            qforge.enqueue_many(app_db, "", [None])
        assert bad.value.details[0]["field"] == "task"
        job_ids = qforge.enqueue_many(app_db, "echo", [None])  # the transaction is still usable
    assert job_count(db_url, job_ids[0]) == 1


def test_enqueue_many_on_an_async_connection(db_url):
    async def main() -> tuple[list[uuid.UUID], list[uuid.UUID]]:
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            async with conn.transaction():
                kept = await qforge.enqueue_many(conn, "echo", [{"n": 1}, None])
            dropped = await qforge.enqueue_many_async(conn, "echo", [None] * 3)
            await conn.rollback()
            return kept, dropped
    kept, dropped = asyncio.run(main())
    assert job_count(db_url) == 2 and all(job_count(db_url, job_id) == 1 for job_id in kept)
    assert not any(job_count(db_url, job_id) for job_id in dropped)
