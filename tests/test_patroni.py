"""Under Patroni: a two-node cluster in synchronous mode (Debian's patroni and etcd-server, started
here), QForge on a multi-host URL. The leader's PostgreSQL is SIGKILLed mid-drain, Patroni promotes
the synchronous standby, the old leader rejoins as a replica (pg_rewind), and a second kill fails
back: 3,000 jobs and 5 workflows end with 0 lost and 0 run twice, `replay --verify` holds, and an
SSE subscriber connected throughout receives every event once, in log order. Run with `-s` to see
the timeline."""

from __future__ import annotations

import time

import psycopg
import pytest

from cluster_procs import (Enqueuer, RetryingClient, assert_exactly_once, first_claim_after, log_dir,
                           received_positions, replay_verify, start_stack, submit_diamonds, wait_all_done)
from patroni_cluster import PatroniCluster
from qforge.migrate import migrate
from test_sse import SSEReader
from test_worker_support import Processes, tasks_dir, wait_for  # noqa: F401  (fixture)

DBNAME = "qforge"
JOBS = 3_000
WORKFLOWS = 5


@pytest.fixture
def patroni():
    cluster = PatroniCluster()
    try:
        cluster.sql(f"CREATE DATABASE {DBNAME}")
        with psycopg.connect(cluster.leader().url(DBNAME), autocommit=True) as conn:
            migrate(conn)
        yield cluster
    finally:
        cluster.close()


def _succeeded(cluster: PatroniCluster, at_least: int) -> bool:
    try:
        with psycopg.connect(cluster.multi_host_url(DBNAME), connect_timeout=2, autocommit=True) as look:
            return look.execute("SELECT count(*) FROM jobs WHERE status = 'succeeded' AND workflow_id IS NULL"
                                ).fetchone()[0] >= at_least
    except psycopg.OperationalError:
        return False


def _fail_over(cluster: PatroniCluster) -> dict:
    """SIGKILL the leader's PostgreSQL; the timeline of Patroni promoting the other node and of the
    old leader rejoining as the synchronous standby."""
    old = cluster.leader()
    assert old is not None
    started = time.monotonic()
    old.kill_postgres()
    killed_at = time.time()  # after the kill: a claim committed as it came does not count as after it
    cluster.wait(lambda: cluster.leader() not in (None, old), 60, "Patroni to promote the other node")
    promoted = time.monotonic() - started
    cluster.wait(old.is_sync_standby, 120, f"{old.name} to rejoin as the synchronous standby")
    return {"killed_at": killed_at, "from": old.name, "promoted_s": promoted,
            "rejoined_s": time.monotonic() - started}


def test_patroni_fails_over_and_back_mid_drain_losing_nothing_and_running_nothing_twice(
        patroni: PatroniCluster, tmp_path, tasks_dir):
    url = patroni.multi_host_url(DBNAME)
    processes = Processes(url, log_dir(tmp_path), tasks_dir)
    reader = setup = None
    enqueuers: list[Enqueuer] = []
    try:
        api, base, workers = start_stack(processes)
        reader = SSEReader(base, params={"after": "0"})
        setup = RetryingClient(base)
        workflows = submit_diamonds(setup, "patroni", 3)
        # Paced so that jobs are still arriving and running when each kill comes.
        enqueuers.append(Enqueuer(base, 0, JOBS // 2, per_second=150, prefix="patroni-job"))
        wait_for(lambda: _succeeded(patroni, 500), timeout=120, message="500 jobs to succeed", interval=0.1)
        first = _fail_over(patroni)
        enqueuers[0].join()

        workflows += submit_diamonds(setup, "patroni-back", WORKFLOWS - 3)
        enqueuers.append(Enqueuer(base, JOBS // 2, JOBS, per_second=150, prefix="patroni-job"))
        wait_for(lambda: _succeeded(patroni, JOBS // 2 + 500), timeout=120, message="more jobs to succeed",
                 interval=0.1)
        second = _fail_over(patroni)
        enqueuers[1].join()
        assert second["from"] != first["from"]  # it went back

        leader_url = patroni.leader().url(DBNAME)
        wait_all_done(leader_url, WORKFLOWS)
        acknowledged = {**enqueuers[0].acknowledged, **enqueuers[1].acknowledged}
        log_order = assert_exactly_once(leader_url, acknowledged, JOBS, workflows)
        claims = [first_claim_after(leader_url, each["killed_at"]) for each in (first, second)]
        replay_verify(leader_url)
        assert received_positions(reader, len(log_order)) == log_order
        assert api.alive() and all(worker.alive() for worker in workers)
        retries = setup.retries + sum(e.retries for e in enqueuers)
        for n, (each, claim) in enumerate(zip((first, second), claims), 1):
            print(f"\nfailover {n}: SIGKILL of {each['from']}'s PostgreSQL; promoted after {each['promoted_s']:.2f}s;"
                  f" first claim on the new leader after {claim:.2f}s; old leader back as the synchronous"
                  f" standby after {each['rejoined_s']:.2f}s")
        print(f"{JOBS} jobs + {WORKFLOWS} workflows: 0 lost, 0 twice; {len(log_order)} events streamed once"
              f" in order; client retries {retries}")
    finally:
        for closing in (*enqueuers, reader, setup):
            if closing is not None:
                closing.close()
        processes.close()
        print(processes.logs()[-6000:])
