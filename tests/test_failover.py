"""A real failover: the primary is SIGKILLed mid-drain and its synchronous standby promoted by hand.

The API, the monitor and 3 workers all run on the multi-host URL and find the
new primary by themselves; a client enqueues through the API and retries what
the failover makes it retry; an SSE subscriber stays connected throughout.
(tests/test_patroni.py does the same under Patroni.) Run with `-s` to see the figures.
"""

from __future__ import annotations

import time

import psycopg

from cluster_procs import (DBNAME, Enqueuer, RetryingClient, assert_exactly_once, cluster,  # noqa: F401  (fixture)
                           first_claim_after, log_dir, received_positions, replay_verify, start_stack,
                           submit_diamonds, wait_all_done)
from pgcluster import Cluster
from test_sse import SSEReader
from test_worker_support import Processes, tasks_dir, wait_for  # noqa: F401

JOBS = 5_000
WORKFLOWS = 6
KILL_AT_SUCCEEDED = 2_000


def test_failover_to_a_synchronous_standby_loses_nothing_and_runs_nothing_twice(
        cluster: Cluster, tmp_path, tasks_dir):
    standby = cluster.standbys[0]
    url = cluster.multi_host_url(DBNAME)
    processes = Processes(url, log_dir(tmp_path), tasks_dir)
    reader = enqueuer = setup = None
    try:
        api, base, workers = start_stack(processes)
        reader = SSEReader(base, params={"after": "0"})
        setup = RetryingClient(base)
        workflows = submit_diamonds(setup, "failover", WORKFLOWS)
        enqueuer = Enqueuer(base, 0, JOBS)

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
        enqueuer.join()

        wait_all_done(standby.url(DBNAME), WORKFLOWS)
        log_order = assert_exactly_once(standby.url(DBNAME), enqueuer.acknowledged, JOBS, workflows)
        first_claim = first_claim_after(standby.url(DBNAME), killed_at)
        replay_verify(standby.url(DBNAME))
        # The subscriber's cursor stayed valid on the new primary: every event, once, in log order.
        assert received_positions(reader, len(log_order)) == log_order

        for worker in workers:
            assert worker.alive()
            worker.wait_log("database back")
        assert api.alive()
        api.wait_log("database unavailable")
        api.wait_log("database back")
        print(f"\nfailover: {JOBS} jobs + {WORKFLOWS} workflows acknowledged, 0 lost, 0 twice; "
              f"{len(log_order)} events streamed once in order; promotion {promotion_seconds:.2f}s; "
              f"kill to first claim on the new primary {first_claim:.2f}s; "
              f"client retries {enqueuer.retries + setup.retries}")
    finally:
        for closing in (enqueuer, reader, setup):
            if closing is not None:
                closing.close()
        processes.close()
        print(processes.logs()[-6000:])
