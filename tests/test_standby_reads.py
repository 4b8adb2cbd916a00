"""QFORGE_READ_DATABASE_URL: reads from a hot standby, writes to the primary, and a client
still reads its own writes (the API waits for the standby's replay, or asks the primary)."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import httpx
import psycopg
import pytest

from cluster_procs import DBNAME, cluster  # noqa: F401  (fixture)
from pgcluster import Cluster
from qforge.api.routes import events as events_route
from qforge.api.app import create_app
from qforge.api.consistency import HEADER
from qforge.api.server import BackgroundServer
from qforge.commands.enqueue import JobSpec, enqueue
from qforge.settings import Settings
from test_sse import SSEReader

WAIT_SECONDS = 1.0


def serve(cluster: Cluster, read_wait_seconds: float = WAIT_SECONDS) -> BackgroundServer:
    primary = cluster.primary.url(DBNAME)
    settings = Settings(database_url=primary, read_database_url=cluster.standbys[0].url(DBNAME),
                        read_wait_seconds=read_wait_seconds, api_token=None)
    return BackgroundServer(create_app(primary, settings=settings))


@pytest.fixture
def api(cluster: Cluster) -> Iterator[str]:
    with serve(cluster) as server:
        yield server.url


def enqueue_on_primary(cluster: Cluster, n: int) -> str:
    """A job written behind the API's back (so the API has no write position to wait for)."""
    with psycopg.connect(cluster.primary.url(DBNAME), autocommit=True) as conn:
        [outcome] = enqueue(conn, [JobSpec(task="echo", payload={"n": n})], actor="test")
    return str(outcome.id)


def pause_replay(cluster: Cluster) -> None:
    cluster.standbys[0].sql("SELECT pg_wal_replay_pause()")


def resume_replay(cluster: Cluster) -> None:
    cluster.standbys[0].sql("SELECT pg_wal_replay_resume()")


def test_reads_come_from_the_standby_and_writes_go_to_the_primary(cluster, api):
    pause_replay(cluster)
    hidden = enqueue_on_primary(cluster, 1)  # committed on the primary, not replayed on the standby
    assert httpx.get(f"{api}/jobs/{hidden}").status_code == 404
    assert hidden not in {j["id"] for j in httpx.get(f"{api}/jobs").json()["items"]}
    resume_replay(cluster)
    cluster.wait_replayed(cluster.standbys[0])
    assert httpx.get(f"{api}/jobs/{hidden}").status_code == 200
    assert [e["type"] for e in httpx.get(f"{api}/jobs/{hidden}/events").json()["events"]] == ["Enqueued"]
    # The write itself went to the primary (a standby refuses writes) and says where it is in the WAL.
    created = httpx.post(f"{api}/jobs", json={"task": "echo"})
    assert created.status_code == 201, created.text
    assert created.headers[HEADER] and created.cookies["qforge_lsn"] == created.headers[HEADER]
    with psycopg.connect(cluster.primary.url(DBNAME)) as primary:
        assert primary.execute("SELECT count(*) FROM jobs WHERE id = %s", (created.json()["id"],)).fetchone() == (1,)


def test_a_client_reads_its_own_write_while_the_standby_lags(cluster, api):
    pause_replay(cluster)
    created = httpx.post(f"{api}/jobs", json={"task": "echo", "tags": {"k": "v"}})
    assert created.status_code == 201
    job_id = created.json()["id"]
    started = time.monotonic()
    # The standby has not replayed the write: after QFORGE_READ_WAIT_SECONDS the primary answers.
    assert httpx.get(f"{api}/jobs/{job_id}").json()["id"] == job_id
    assert time.monotonic() - started >= WAIT_SECONDS * 0.9
    assert job_id in {e["id"] for e in httpx.get(f"{api}/executions", params={"tag": "k:v"}).json()["items"]}

    # Another API replica never saw that write: the client's header (or cookie) carries it.
    with serve(cluster) as other:
        assert httpx.get(f"{other.url}/jobs/{job_id}").status_code == 404  # no position given: the standby
        assert httpx.get(f"{other.url}/jobs/{job_id}",
                         headers={HEADER: created.headers[HEADER]}).status_code == 200
        assert httpx.get(f"{other.url}/jobs/{job_id}",
                         cookies={"qforge_lsn": created.headers[HEADER]}).status_code == 200
        assert httpx.get(f"{other.url}/jobs/{job_id}", headers={HEADER: "nonsense"}).status_code == 404
    resume_replay(cluster)


def test_a_read_after_a_write_waits_for_the_standby_rather_than_asking_the_primary(cluster):
    with serve(cluster, read_wait_seconds=10) as server:
        pause_replay(cluster)
        created = httpx.post(f"{server.url}/jobs", json={"task": "echo"}).json()
        answers: dict[str, int] = {}
        reader = threading.Thread(target=lambda: answers.update(
            mine=httpx.get(f"{server.url}/jobs/{created['id']}", timeout=30).status_code))
        started = time.monotonic()
        reader.start()
        time.sleep(0.5)
        assert reader.is_alive()  # waiting for the standby
        resume_replay(cluster)
        reader.join(timeout=15)
        elapsed = time.monotonic() - started
        assert answers == {"mine": 200}
        assert 0.5 <= elapsed < 5, elapsed  # answered once replayed, well before the 10 s bound


def test_the_event_hub_waits_for_the_standby_and_streams_from_it(cluster, api, monkeypatch):
    monkeypatch.setattr(events_route, "PING_SECONDS", 0.3)
    reader = SSEReader(api, params={"after": "0"})
    try:
        ids = [httpx.post(f"{api}/jobs", json={"task": "echo", "payload": {"n": n}}).json()["id"]
               for n in range(20)]
        received = reader.take(20)
        assert [m["json"]["stream_id"] for m in received] == ids
        page = httpx.get(f"{api}/events", params={"after": "0", "limit": 100}).json()["events"]
        assert [e["stream_id"] for e in page] == ids
    finally:
        reader.close()


def test_a_late_commit_with_a_lower_position_is_delivered_once_from_a_standby(cluster, api, monkeypatch):
    """The gapless cursor holds on the standby: it knows the primary's running transactions."""
    monkeypatch.setattr(events_route, "PING_SECONDS", 0.3)
    reader = SSEReader(api, params={"after": "0"})
    primary_url = cluster.primary.url(DBNAME)
    try:
        with psycopg.connect(primary_url, autocommit=True) as conn_a, \
                psycopg.connect(primary_url, autocommit=True) as conn_b:
            with conn_a.transaction():
                [a] = enqueue(conn_a, [JobSpec(task="echo", payload={"n": 1})])  # the lower position, open
                [b] = enqueue(conn_b, [JobSpec(task="echo", payload={"n": 2})])  # committed first
                cluster.wait_replayed(cluster.standbys[0])
                with psycopg.connect(cluster.standbys[0].url(DBNAME)) as standby:
                    assert standby.execute("SELECT count(*) FROM events WHERE stream_id = %s",
                                           (b.id,)).fetchone() == (1,)  # B is on the standby...
                assert reader.quiet_for(1.5)  # ...but must wait behind the open A
            received = reader.take(2)
        assert [m["json"]["stream_id"] for m in received] == [str(a.id), str(b.id)]
        assert received[0]["json"]["position"] < received[1]["json"]["position"]
        assert reader.quiet_for(1.5)
    finally:
        reader.close()


def test_as_of_reads_go_to_the_primary(cluster, api):
    created = httpx.post(f"{api}/jobs", json={"task": "echo"}).json()
    position = httpx.get(f"{api}/jobs/{created['id']}/events").json()["events"][0]["position"]
    as_of = httpx.get(f"{api}/jobs/{created['id']}", params={"as_of": position})
    assert as_of.status_code == 200, as_of.text  # the fold needs temporary tables: not on a standby
    assert as_of.json()["status"] == "pending"


def test_with_the_standby_down_reads_go_to_the_primary(cluster, api):
    job_id = httpx.post(f"{api}/jobs", json={"task": "echo"}).json()["id"]
    cluster.primary.sql("ALTER SYSTEM SET synchronous_standby_names = ''")  # else commits wait for it
    cluster.primary.sql("SELECT pg_reload_conf()")
    cluster.standbys[0].stop()
    later = enqueue_on_primary(cluster, 3)
    for path in (f"/jobs/{job_id}", f"/jobs/{later}", "/jobs", "/queues", "/workers", "/metrics",
                 "/events?after=0"):
        assert httpx.get(f"{api}{path}", timeout=10).status_code == 200, path
