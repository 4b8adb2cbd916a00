"""Keys the way users reach them: a real `qforge api`, real workers, the client and `qforge keys`.

A one-slot worker alternates between fairness keys (60 jobs of A, then 5 of B: B's interleave), a
weight set with the CLI gives a key its turns, a concurrency limit set with the client holds over
what the jobs say, and `qforge replay --verify` agrees with the live tables afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from uuid import UUID

import psycopg
import pytest

import qforge
from cluster_procs import start_api
from qforge.client.errors import Invalid, NotFound
from test_worker_support import QFORGE, Processes, procs, scalar, tasks_dir, wait_for  # noqa: F401  (fixtures)


def claim_order(conn: psycopg.Connection, ids: list[UUID]) -> list[UUID]:
    rows = conn.execute("SELECT stream_id FROM events WHERE type = 'Claimed' AND stream_id = ANY(%s)"
                        " ORDER BY position", [ids]).fetchall()
    return [row["stream_id"] for row in rows]


def all_done(conn: psycopg.Connection, ids: list[UUID]) -> bool:
    return scalar(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status <> 'succeeded'", ids) == 0


def keys_cli(base: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(QFORGE), "keys", *args, "--api-url", base], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "QFORGE_API_TOKEN": ""})


def test_a_one_slot_worker_alternates_keys_and_keys_set_centrally_hold(conn: psycopg.Connection,
                                                                        procs: Processes, db_url: str) -> None:
    _, base = start_api(procs)
    client = qforge.Client(base)
    a = [client.enqueue("echo", {"n": n}, fairness_key="A").id for n in range(60)]
    b = [client.enqueue("echo", {"n": n}, fairness_key="B").id for n in range(5)]
    procs.worker("--concurrency", "1", "--name", "one-slot")
    wait_for(lambda: all_done(conn, a + b), timeout=60, message="65 jobs done")
    order = claim_order(conn, a + b)
    assert [order.index(job) for job in b] == [1, 3, 5, 7, 9], "B's jobs interleave with A's backlog"

    # a weight, set with the CLI: B takes two turns per rotation
    changed = keys_cli(base, "set", "B", "--weight", "2")
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout.split("\n")[0].split() == ["KEY", "CONCURRENCY", "CONFIGURED", "WEIGHT", "RATE/S",
                                                     "BURST", "RUNNING", "CLAIMED"]
    assert changed.stdout.split("\n")[1].split()[:4] == ["B", "-", "-", "2"]
    a2 = [client.enqueue("slow", {"seconds": 0.02}, fairness_key="A", queue="w").id for _ in range(10)]
    b2 = [client.enqueue("slow", {"seconds": 0.02}, fairness_key="B", queue="w").id for _ in range(10)]
    procs.worker("--concurrency", "1", "--queues", "w", "--name", "weighted")  # after both are queued
    wait_for(lambda: all_done(conn, a2 + b2), timeout=60, message="the weighted jobs done")
    owner = {**{job: "A" for job in a2}, **{job: "B" for job in b2}}
    assert "".join(owner[job] for job in claim_order(conn, a2 + b2))[:12] == "ABBABBABBABB"

    # a concurrency limit, set with the client: 1 at a time, whatever the jobs say (4)
    assert client.set_key("solo", concurrency_limit=1).concurrency_limit == 1
    solo = [client.enqueue("slow", {"seconds": 0.3}, concurrency_key="solo", concurrency_limit=4,
                           queue="c").id for _ in range(4)]
    procs.worker("--concurrency", "4", "--queues", "c", "--name", "four-slots")
    wait_for(lambda: all_done(conn, solo), timeout=60, message="the limited jobs done")
    spans = conn.execute(
        "SELECT min(occurred_at) FILTER (WHERE type = 'Claimed') AS began,"
        "       min(occurred_at) FILTER (WHERE type = 'Succeeded') AS ended"
        "  FROM events WHERE stream_id = ANY(%s) GROUP BY stream_id ORDER BY 1", [solo]).fetchall()
    assert all(later["began"] >= earlier["ended"] for earlier, later in zip(spans, spans[1:])), spans

    # reading them back: the client (sync and async) and the CLI
    listed = {key.key: key for key in client.keys()}
    assert {"A", "B", "solo"} <= set(listed)
    assert (listed["B"].weight, listed["B"].fairness_claimed) == (2, 15)
    assert listed["solo"].concurrency_limit_in_force == 1 and listed["solo"].running == 0
    assert [e.type for e in client.key_events("B")] == ["KeyConfigured"]
    with pytest.raises(NotFound):
        client.key("nobody")
    with pytest.raises(Invalid) as refused:
        client.set_key("B", weight=0)
    assert "weight" in str(refused.value.details)

    async def read_async() -> tuple:
        async with qforge.AsyncClient(base) as aclient:
            return await aclient.key("solo"), await aclient.keys()
    solo_view, all_keys = asyncio.run(read_async())
    assert solo_view.concurrency_limit == 1 and len(all_keys) == len(listed)

    shown = keys_cli(base, "show", "solo", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["concurrency_limit"] == 1
    refused_cli = keys_cli(base, "set", "solo", "--burst", "3")
    assert refused_cli.returncode == 1 and "burst needs a rate_per_second" in refused_cli.stderr
    cleared = keys_cli(base, "set", "solo", "--concurrency-limit", "none", "--json")
    assert json.loads(cleared.stdout)["concurrency_limit"] is None
    assert json.loads(cleared.stdout)["concurrency_limit_in_force"] == 4  # the jobs' own again

    verify = subprocess.run([str(QFORGE), "replay", "--verify", "--database-url", db_url],
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    client.close()
