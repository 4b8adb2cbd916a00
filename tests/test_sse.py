"""GET /events/stream with a real uvicorn server and streaming clients: order, resume with
Last-Event-ID, the out-of-order commit case, filters, and a slow client."""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from datetime import datetime, timezone
from typing import Iterator
from urllib.parse import urlsplit
from uuid import UUID, uuid4

import httpx
import psycopg
import pytest

from qforge.api.routes import events as events_route
from qforge.api.app import create_app
from qforge.api.hub import EventHub, encode
from qforge.api.server import BackgroundServer
from qforge.commands.enqueue import JobSpec, enqueue
from qforge.commands.specs import StepSpec, WorkflowSpec
from qforge.workflows.engine import submit
from qforge.events.store import decode_cursor
from qforge.events.types import Event
from qforge.settings import Settings


class SSEReader:
    """A streaming client in a thread; parsed messages arrive on a queue."""

    def __init__(self, base_url: str, params: dict | None = None, headers: dict | None = None):
        self.messages: queue.Queue[dict] = queue.Queue()
        self._stop = threading.Event()
        self._client = httpx.Client(base_url=base_url, timeout=httpx.Timeout(10, read=None))
        self._context = self._client.stream("GET", "/events/stream", params=params, headers=headers)
        self.response = self._context.__enter__()
        assert self.response.status_code == 200, self.response.read()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        message: dict[str, str] = {}
        try:
            for line in self.response.iter_lines():
                if self._stop.is_set():
                    return
                if line == "":
                    if "data" in message:
                        message["json"] = json.loads(message["data"])
                        self.messages.put(message)
                    message = {}
                elif not line.startswith(":"):
                    name, _, value = line.partition(":")
                    message[name] = value[1:] if value.startswith(" ") else value
        except Exception:  # the stream was closed under us: the end of this reader
            return

    def take(self, count: int, timeout: float = 10.0) -> list[dict]:
        taken, deadline = [], time.monotonic() + timeout
        while len(taken) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"got {len(taken)} of {count} events: {taken}")
            try:
                taken.append(self.messages.get(timeout=remaining))
            except queue.Empty:
                continue
        return taken

    def quiet_for(self, seconds: float) -> bool:
        try:
            extra = self.messages.get(timeout=seconds)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected event {extra}")

    def close(self) -> None:
        self._stop.set()  # the reader wakes at the next ping and leaves
        self._thread.join(timeout=5)
        self._context.__exit__(None, None, None)
        self._client.close()


@pytest.fixture
def server(db_url: str, monkeypatch) -> Iterator[str]:
    monkeypatch.setattr(events_route, "PING_SECONDS", 0.3)  # readers notice close() quickly
    app = create_app(db_url, settings=Settings(database_url=db_url, api_token=None))
    with BackgroundServer(app) as running:
        yield running.url


@pytest.fixture
def readers() -> Iterator[list[SSEReader]]:
    opened: list[SSEReader] = []
    yield opened
    for reader in opened:
        reader.close()


def open_reader(readers: list, url: str, **kwargs) -> SSEReader:
    reader = SSEReader(url, **kwargs)
    readers.append(reader)
    return reader


def add_jobs(conn, *numbers: int, **fields) -> list:
    return [e.id for e in enqueue(conn, [JobSpec(task="echo", payload={"n": n}, **fields)
                                         for n in numbers])]


def numbers(messages: list[dict]) -> list[int]:
    return [m["json"]["data"]["payload"]["n"] for m in messages]


def test_events_arrive_in_log_order_with_cursor_ids(server, conn, db_url, readers):
    add_jobs(conn, 0, 1, 2)
    reader = open_reader(readers, server, params={"after": "0"})
    first = reader.take(3)
    def writer(first: int) -> None:  # concurrent transactions, commits in any order
        with psycopg.connect(db_url, autocommit=True) as own:
            for n in range(first, first + 10):
                add_jobs(own, n)

    workers = [threading.Thread(target=writer, args=(10 + 10 * k,)) for k in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    rest = reader.take(30)
    messages = first + rest
    assert numbers(first) == [0, 1, 2]
    assert sorted(numbers(rest)) == list(range(10, 40))
    cursors = [decode_cursor(m["id"]) for m in messages]
    assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors)
    assert all(m["event"] == "Enqueued" == m["json"]["type"] for m in messages)
    envelope = messages[0]["json"]
    assert {"position", "stream_type", "stream_id", "version", "type", "data", "tags",
            "occurred_at", "actor"} <= set(envelope)
    # The same order as the paged log.
    paged = httpx.get(f"{server}/events", params={"after": "0", "limit": 1000}).json()["events"]
    assert [e["position"] for e in paged] == [m["json"]["position"] for m in messages]
    assert reader.quiet_for(0.5)


def test_without_a_cursor_the_stream_starts_at_the_live_tail(server, conn, readers):
    add_jobs(conn, 1, 2)
    reader = open_reader(readers, server)  # its tail is fixed before the response starts
    add_jobs(conn, 3)
    assert numbers(reader.take(1)) == [3]
    assert reader.quiet_for(0.5)


def test_backlog_starts_that_many_events_before_the_live_tail(server, conn, readers):
    add_jobs(conn, 1, 2, 3)
    reader = open_reader(readers, server, params={"backlog": 2})
    add_jobs(conn, 4)
    assert numbers(reader.take(3)) == [2, 3, 4]
    assert reader.quiet_for(0.5)
    everything = open_reader(readers, server, params={"backlog": 1000})  # more than there is: all of it
    assert numbers(everything.take(4)) == [1, 2, 3, 4]


def test_reconnect_with_last_event_id_gets_exactly_the_missed_events(server, conn, readers):
    add_jobs(conn, *range(6))
    first = open_reader(readers, server, params={"after": "0"})
    seen = first.take(6)
    first.close()
    readers.remove(first)
    add_jobs(conn, *range(6, 9))  # appended while the client was away
    # The browser resends the original URL (?after=0) plus Last-Event-ID: the header wins.
    again = open_reader(readers, server, params={"after": "0"},
                        headers={"Last-Event-ID": seen[2]["id"]})
    assert numbers(again.take(6)) == [3, 4, 5, 6, 7, 8]
    assert again.quiet_for(1.0)
    via_query = open_reader(readers, server, params={"after": seen[4]["id"]})
    assert numbers(via_query.take(4)) == [5, 6, 7, 8]
    assert via_query.quiet_for(0.5)


def test_a_late_commit_with_a_lower_position_is_delivered_once_and_never_skipped(
        server, conn, db_url, readers):
    reader = open_reader(readers, server, params={"after": "0"})
    with psycopg.connect(db_url, autocommit=True) as conn_a, \
            psycopg.connect(db_url, autocommit=True) as conn_b:
        with conn_a.transaction():
            [job_a] = add_jobs(conn_a, 1)  # takes the lower position, stays uncommitted
            [job_b] = add_jobs(conn_b, 2)  # a higher position, committed first
            position = {row[0]: row[1] for row in conn_b.execute(
                "SELECT stream_id, position FROM events").fetchall()}
            assert job_a not in position  # A is invisible to others until it commits
            # B is committed but must wait behind the open A: a reader that took B now
            # would have to skip A later.
            assert reader.quiet_for(1.5)
        received = reader.take(2)
    assert [m["json"]["stream_id"] for m in received] == [str(job_a), str(job_b)]
    assert received[0]["json"]["position"] < received[1]["json"]["position"]
    assert reader.quiet_for(1.5)  # and nothing twice


def test_a_transaction_that_appends_nothing_still_lets_readers_through(server, conn, db_url, readers):
    """xmin only moves when the old transaction ends, and it sends no NOTIFY: the hub polls."""
    reader = open_reader(readers, server, params={"after": "0"})
    with psycopg.connect(db_url, autocommit=True) as idle:
        with idle.transaction():
            idle.execute("SELECT pg_current_xact_id()")  # holds xmin back, appends nothing
            add_jobs(conn, 1)
            assert reader.quiet_for(1.0)
    assert numbers(reader.take(1, timeout=5)) == [1]


def test_filters_by_workflow_job_tag_and_type(server, conn, readers):
    workflow_id, _ = submit(conn, WorkflowSpec(name="w", tags={"team": "x"}, steps=[
        StepSpec(step="a", task="echo"), StepSpec(step="b", task="echo", depends_on=["a"])]))
    [job_id] = add_jobs(conn, 1, tags={"team": "y"})
    add_jobs(conn, 2)
    of_workflow = open_reader(readers, server, params={"after": "0", "workflow_id": str(workflow_id)})
    assert [m["event"] for m in of_workflow.take(3)] == ["WorkflowSubmitted", "Enqueued", "Enqueued"]
    of_job = open_reader(readers, server, params={"after": "0", "job_id": str(job_id)})
    assert [m["json"]["stream_id"] for m in of_job.take(1)] == [str(job_id)]
    of_tag = open_reader(readers, server, params={"after": "0", "tag": "team:y"})
    assert [m["json"]["stream_id"] for m in of_tag.take(1)] == [str(job_id)]
    of_type = open_reader(readers, server, params={"after": "0", "type": "WorkflowSubmitted,Claimed"})
    assert [m["event"] for m in of_type.take(1)] == ["WorkflowSubmitted"]
    for reader in (of_workflow, of_job, of_tag, of_type):
        assert reader.quiet_for(0.3)


def test_bad_stream_parameters_are_4xx(server):
    assert httpx.get(f"{server}/events/stream", params={"after": "x-y"}).status_code == 400
    assert httpx.get(f"{server}/events/stream", headers={"Last-Event-ID": "nope"}).status_code == 400
    assert httpx.get(f"{server}/events/stream", params={"workflow_id": "w"}).status_code == 422


def test_a_client_that_never_reads_does_not_hold_up_others(server, conn, readers):
    address = urlsplit(server)
    stalled = socket.create_connection((address.hostname, address.port))
    try:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(b"GET /events/stream?after=0 HTTP/1.1\r\nHost: x\r\n\r\n")
        blob = "z" * 4000
        for start in range(0, 600, 100):  # ~2.4 MB of events: far more than socket buffers hold
            enqueue(conn, [JobSpec(task="echo", payload={"n": n, "blob": blob})
                           for n in range(start, start + 100)])
        reader = open_reader(readers, server, params={"after": "0"})
        assert numbers(reader.take(600, timeout=30)) == list(range(600))
    finally:
        stalled.close()


def _cached_event(position: int, *, stream_id: UUID, type: str = "Enqueued", actor: str = "a",
                  workflow_id: UUID | None = None, tags: dict[str, str] | None = None) -> Event:
    return Event(position=position, xid=100, stream_type="job", stream_id=stream_id, version=1, type=type,
                 schema_version=1, data={}, tags=tags or {}, workflow_id=workflow_id,
                 occurred_at=datetime.now(timezone.utc), actor=actor)


def test_cached_batches_filter_by_key_and_unfiltered_ones_are_shared() -> None:
    """The hub's cache path: what each filter keeps (str keys, not Events), and one joined
    batch per cursor for every unfiltered subscriber, cut at `limit`."""
    hub = EventHub("postgresql://unused")
    job, other, workflow = uuid4(), uuid4(), uuid4()
    events = [_cached_event(1, stream_id=job, tags={"team": "y"}),
              _cached_event(2, stream_id=other, type="Claimed", actor="w1", workflow_id=workflow),
              _cached_event(3, stream_id=workflow, type="WorkflowSubmitted", tags={"team": "x"})]
    hub.cache.extend(encode(event) for event in events)
    hub.cached_from = (100, 0)

    def positions(filters: events_route.Filters) -> list[int]:
        batch = hub.batch_after((100, 0), 10, filters.match if filters else None)
        assert batch.cursor == (100, 3) and batch.count == 3  # filtered out or not, all are passed
        return [json.loads(line[6:])["position"] for line in batch.sse.decode().splitlines()
                if line.startswith("data: ")]

    assert positions(events_route.Filters(None, None, [], set())) == [1, 2, 3]
    assert positions(events_route.Filters(workflow, None, [], set())) == [2, 3]
    assert positions(events_route.Filters(None, job, [], set())) == [1]
    assert positions(events_route.Filters(None, None, [("team", "x")], set())) == [3]
    assert positions(events_route.Filters(None, None, [("team", "x"), ("team", "y")], set())) == []
    assert positions(events_route.Filters(None, None, [], {"Claimed", "Enqueued"})) == [1, 2]
    assert positions(events_route.Filters(None, None, [], set(), actor="w1")) == [2]
    shared = hub.batch_after((100, 0), 10)
    assert hub.batch_after((100, 0), 10) is shared  # joined once for every unfiltered subscriber
    assert hub.batch_after((100, 1), 1) == ((100, 2), 1, hub.cache[1].sse)
    assert hub.batch_after((99, 5), 10) is None  # behind the cache: the subscriber reads the log


def test_a_reader_whose_plan_was_made_on_an_empty_log_still_looks_tags_up_by_key(db_url):
    """The hub's (and GET /events') read is a prepared statement: after a few runs its plan is
    cached for the session. Made while jobs was nearly empty (a new database, before autovacuum's
    first ANALYZE), it scanned jobs for the tags of every untagged event: pages got slower as jobs
    grew, and the benchmark's SSE lag reached 2 s. jobs' sequential-scan counter must not move
    while a reader pages through thousands of such events."""
    from qforge.events.store import START, cursor_of, read_after

    def seq_scans(conn) -> int:
        return conn.execute("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'jobs'").fetchone()[0]

    with psycopg.connect(db_url, autocommit=True) as writer, psycopg.connect(db_url, autocommit=True) as reader:
        writer.execute("ALTER TABLE jobs SET (autovacuum_enabled = false)")  # no ANALYZE to re-plan midway
        writer.execute("ANALYZE jobs")  # as a new database has it: jobs known to be empty
        for _ in range(12):  # enough runs for a prepared statement to settle on its generic plan
            enqueue(writer, [JobSpec(task="echo")])
            read_after(reader, START)
        enqueue(writer, [JobSpec(task="echo") for _ in range(3000)])
        reader.execute("SELECT pg_stat_force_next_flush()")
        before = seq_scans(writer)
        cursor, seen = START, 0
        while page := read_after(reader, cursor, limit=500):
            seen += len(page)
            assert all(event.tags == {} for event in page)
            cursor = cursor_of(page[-1])
        reader.execute("SELECT pg_stat_force_next_flush()")
        assert seen == 3012
        assert seq_scans(writer) - before <= 1, "the read scanned jobs instead of looking streams up by key"


def test_the_gapless_page_read_is_never_jit_compiled(db_url):
    """events_after_page is planned with its arguments unknown, so its LIMIT is costed as a tenth of
    the log; on a 50M-event log that cost crossed JIT's thresholds and every page spent 163 ms
    compiling a 0.4 ms read. JIT is off in the function. Where the server can JIT at all, a page
    read with every JIT threshold at zero must still show no JIT in its plan."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        config = conn.execute("SELECT proconfig FROM pg_proc WHERE proname = 'events_after_page'").fetchone()[0]
        assert "jit=off" in config
        enqueue(conn, [JobSpec(task="echo")])
        if not conn.execute("SELECT pg_jit_available()").fetchone()[0]:
            return  # this server has no JIT provider: the setting above is all there is to check
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        for statement in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                          "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_analyze = on",
                          "SET auto_explain.log_level = notice", "SET jit = on", "SET jit_above_cost = 0",
                          "SET jit_inline_above_cost = 0", "SET jit_optimize_above_cost = 0"):
            conn.execute(statement)
        conn.execute("SELECT count(*) FROM events_after_page('0'::xid8, 0, 500)").fetchone()
        inner = [n for n in notices if "LIMIT page" in n]
        assert inner and not any("JIT:" in n for n in inner), inner
