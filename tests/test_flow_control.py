"""Flow control: schedules fire each tick once, paused and rate-limited queues, concurrency
per key, fairness between tenants (commands and the HTTP API, against a real database)."""

from __future__ import annotations

import re
import threading
from datetime import datetime, timedelta, timezone
from typing import Iterator

import httpx
import psycopg
import pytest

from qforge.commands import schedules
from qforge.commands.claim import claim
from qforge.commands.enqueue import enqueue
from qforge.commands.specs import JobSpec
from qforge.commands.queues import QueueSettingsSpec, configure_queue
from qforge.commands.report import Report, complete
from qforge.commands.schedules import ScheduleSpec, choose_ticks, fire_due
from qforge.projections import replay
from qforge.sql import q
from tests.factories import make_job
from tests.test_api import assert_error, serve

T0 = datetime(2031, 1, 1, tzinfo=timezone.utc)


@pytest.fixture
def api(db_url: str) -> Iterator[httpx.Client]:
    yield from serve(db_url, api_token=None)


def _jobs_of(conn, name: str) -> list[dict]:
    return conn.execute("SELECT id, idempotency_key, tags FROM jobs WHERE tags ->> 'schedule' = %s"
                        " ORDER BY idempotency_key", [name]).fetchall()


# --------------------------------------------------------------------------- schedules

def test_six_field_cron_fires_every_two_seconds_once_per_tick(conn: psycopg.Connection) -> None:
    spec = ScheduleSpec(name="every2", cron="*/2 * * * * *", job={"task": "echo", "payload": {"x": 1}})
    created = schedules.create_schedule(conn, spec, now=T0)
    assert created["next_fire_at"] == T0 + timedelta(seconds=2)
    for second in range(0, 11):  # a monitor looking every second, twice
        for _ in range(2):
            fire_due(conn, actor="m", grace_seconds=60, now=T0 + timedelta(seconds=second, milliseconds=500))
    jobs = _jobs_of(conn, "every2")
    assert [j["idempotency_key"] for j in jobs] == [
        schedules.tick_key("every2", T0 + timedelta(seconds=s)) for s in (2, 4, 6, 8, 10)]
    row = schedules.get_schedule(conn, "every2")
    assert row["fired"] == 5 and row["next_fire_at"] == T0 + timedelta(seconds=12)
    assert row["last_execution_id"] == jobs[-1]["id"]


def test_two_firers_at_once_never_fire_a_tick_twice(db_url: str, conn: psycopg.Connection) -> None:
    schedules.create_schedule(conn, ScheduleSpec(name="race", cron="* * * * * *", job={"task": "echo"}),
                              now=T0)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def firer() -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as own:
                barrier.wait()
                for second in range(1, 31):
                    fire_due(own, actor="m", grace_seconds=60, now=T0 + timedelta(seconds=second))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=firer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(_jobs_of(conn, "race")) == 30
    assert schedules.get_schedule(conn, "race")["fired"] == 30


@pytest.mark.parametrize("catch_up, fired", [("none", [55, 56]), ("latest", [54, 55, 56]),
                                             ("all", list(range(1, 57)))])
def test_catch_up_decides_which_missed_ticks_fire(conn: psycopg.Connection, catch_up: str,
                                                  fired: list[int]) -> None:
    # Ticks every 60 s of the... every second: down from T0 to T0+56.5 s with a 2 s grace.
    spec = ScheduleSpec(name=f"cu-{catch_up}", cron="* * * * * *", job={"task": "echo"}, catch_up=catch_up)
    schedules.create_schedule(conn, spec, now=T0)
    fire_due(conn, actor="m", grace_seconds=2, now=T0 + timedelta(seconds=56, milliseconds=500))
    keys = [j["idempotency_key"] for j in _jobs_of(conn, spec.name)]
    assert sorted(keys) == sorted(schedules.tick_key(spec.name, T0 + timedelta(seconds=s)) for s in fired)
    row = schedules.get_schedule(conn, spec.name)
    assert row["skipped"] == 56 - len(fired)
    assert row["next_fire_at"] == T0 + timedelta(seconds=57)


def test_choose_ticks_keeps_the_ticks_within_the_grace() -> None:
    ticks = [T0 + timedelta(seconds=s) for s in range(10)]
    now = T0 + timedelta(seconds=9)
    assert choose_ticks(ticks, now, 3, "none") == ticks[6:]
    assert choose_ticks(ticks, now, 3, "latest") == ticks[5:]
    assert choose_ticks(ticks, now, 3, "all") == ticks


def test_paused_schedule_does_not_fire_and_resumes_from_now(conn: psycopg.Connection) -> None:
    schedules.create_schedule(conn, ScheduleSpec(name="p", cron="* * * * * *", job={"task": "echo"}), now=T0)
    schedules.update_schedule(conn, "p", {"paused": True}, now=T0)
    assert fire_due(conn, actor="m", grace_seconds=60, now=T0 + timedelta(seconds=10)) == 0
    schedules.update_schedule(conn, "p", {"paused": False}, now=T0 + timedelta(seconds=10))
    assert fire_due(conn, actor="m", grace_seconds=60, now=T0 + timedelta(seconds=12)) == 2  # 11 and 12
    assert len(_jobs_of(conn, "p")) == 2


def test_schedules_replay_equal_live(conn: psycopg.Connection) -> None:
    schedules.create_schedule(conn, ScheduleSpec(name="r", cron="*/5 * * * *", job={"task": "echo"}), now=T0)
    schedules.create_schedule(conn, ScheduleSpec(name="gone", cron="0 * * * *", job={"task": "echo"}), now=T0)
    fire_due(conn, actor="m", grace_seconds=60, now=T0 + timedelta(minutes=5, seconds=1))
    schedules.update_schedule(conn, "r", {"catch_up": "all", "timezone": "Europe/Paris"}, now=T0)
    schedules.delete_schedule(conn, "gone")
    configure_queue(conn, "emails", QueueSettingsSpec(rate_per_second=5, paused=True))
    assert replay.verify(conn) == []


def test_schedule_api_create_list_patch_delete(api: httpx.Client) -> None:
    body = {"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Paris",
            "job": {"task": "echo", "queue": "default", "payload": {"report": True}}}
    created = api.post("/schedules", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["next_fire_at"] is not None and created.json()["catch_up"] == "latest"
    assert_error(api.post("/schedules", json=body), 409, "nightly")
    listed = api.get("/schedules").json()["items"]
    assert [s["name"] for s in listed] == ["nightly"] and listed[0]["next_fire_at"]
    paused = api.patch("/schedules/nightly", json={"paused": True})
    assert paused.status_code == 200 and paused.json()["paused"] and paused.json()["next_fire_at"] is None
    changed = api.patch("/schedules/nightly", json={"cron": "*/2 * * * * *", "paused": False}).json()
    assert changed["cron"] == "*/2 * * * * *" and not changed["paused"]
    events = api.get("/schedules/nightly/events").json()["events"]
    assert [e["type"] for e in events] == ["ScheduleCreated", "SchedulePaused", "ScheduleUpdated",
                                           "ScheduleResumed"]
    assert api.delete("/schedules/nightly").status_code == 204
    assert_error(api.get("/schedules/nightly"), 404)
    assert_error(api.delete("/schedules/nightly"), 404)


@pytest.mark.parametrize("body, words", [
    ({"name": "x", "cron": "* * *", "job": {"task": "echo"}}, ["3 fields"]),
    ({"name": "x", "cron": "61 * * * *", "job": {"task": "echo"}}, ["not a valid cron"]),
    ({"name": "x", "cron": "* * * * *", "timezone": "Mars/Base", "job": {"task": "echo"}}, ["Mars/Base"]),
    ({"name": "x", "cron": "* * * * *"}, ["either job or definition"]),
    ({"name": "x", "cron": "* * * * *", "job": {"task": "echo"}, "definition": "d"}, ["either job"]),
    ({"name": "x", "cron": "* * * * *", "job": {"task": "echo"}, "catch_up": "some"}, ["catch_up"]),
    ({"name": "x", "cron": "* * * * *", "job": {"task": "echo", "idempotency_key": "k"}}, ["idempotency_key"]),
    ({"name": "x y", "cron": "* * * * *", "job": {"task": "echo"}}, ["name"]),
])
def test_bad_schedules_are_refused_naming_the_field(api: httpx.Client, body: dict, words: list[str]) -> None:
    assert_error(api.post("/schedules", json=body), 422, *words)
    assert api.get("/schedules").json()["items"] == []


def test_definition_schedule_starts_a_run_per_tick(api: httpx.Client, conn: psycopg.Connection) -> None:
    stored = api.put("/definitions/etl", json={"steps": [{"step": "a", "task": "echo"}]})
    assert stored.status_code in (200, 201), stored.text
    created = api.post("/schedules", json={"name": "etl-every-second", "cron": "* * * * * *",
                                           "definition": "etl", "inputs": {"day": 1}})
    assert created.status_code == 201, created.text
    due = schedules.get_schedule(conn, "etl-every-second")["next_fire_at"]
    for _ in range(2):  # a second firer finds the ticks fired
        fire_due(conn, actor="m", grace_seconds=60, now=due + timedelta(seconds=2))
    row = schedules.get_schedule(conn, "etl-every-second")
    assert row["fired"] == 3
    assert conn.execute("SELECT count(*) AS n FROM workflows").fetchone()["n"] == 3
    assert conn.execute("SELECT count(*) AS n FROM workflows WHERE id = %s",
                        [row["last_execution_id"]]).fetchone()["n"] == 1


# --------------------------------------------------------------------------- queues

def test_paused_queue_runs_nothing_until_resumed(conn: psycopg.Connection) -> None:
    ids = [make_job(conn, queue="q") for _ in range(3)]
    configure_queue(conn, "q", QueueSettingsSpec(paused=True))
    assert claim(conn, ["q"], 10, "w") == []
    make_job(conn, queue="other")
    assert len(claim(conn, ["q", "other"], 10, "w")) == 1  # only the other queue's
    configure_queue(conn, "q", QueueSettingsSpec(paused=False))
    assert {c.id for c in claim(conn, ["q"], 10, "w")} == set(ids)


def test_rate_limit_spends_tokens_at_the_rate(conn: psycopg.Connection) -> None:
    for _ in range(50):
        make_job(conn, queue="slow", now=T0 - timedelta(seconds=1))
    configure_queue(conn, "slow", QueueSettingsSpec(rate_per_second=2, burst=3), now=T0)
    assert len(claim(conn, ["slow"], 10, "w", now=T0)) == 3  # the burst
    assert len(claim(conn, ["slow"], 10, "w", now=T0 + timedelta(milliseconds=400))) == 0
    assert len(claim(conn, ["slow"], 10, "w", now=T0 + timedelta(milliseconds=500))) == 1
    assert len(claim(conn, ["slow"], 10, "w", now=T0 + timedelta(seconds=10))) == 3  # capped at the burst
    configure_queue(conn, "slow", QueueSettingsSpec(rate_per_second=None), now=T0 + timedelta(seconds=10))
    assert len(claim(conn, ["slow"], 10, "w", now=T0 + timedelta(seconds=10))) == 10


def test_a_large_bucket_is_sharded_and_claimers_spend_it_side_by_side(db_url: str,
                                                                     conn: psycopg.Connection) -> None:
    enqueue(conn, [JobSpec(task="echo", queue="big") for _ in range(450)], now=T0 - timedelta(seconds=1))
    configure_queue(conn, "big", QueueSettingsSpec(rate_per_second=10, burst=400), now=T0)
    shards = conn.execute("SELECT shard, share, tokens FROM queue_buckets WHERE queue = 'big' ORDER BY shard")
    assert [tuple(r.values()) for r in shards] == [(n, 0.25, 100.0) for n in range(4)]
    with psycopg.connect(db_url) as other:
        other.execute("SELECT 1")  # a transaction stays open: its claim keeps its shard locked
        first = claim(other, ["big"], 150, "a", now=T0)
        second = claim(conn, ["big"], 150, "b", now=T0)  # not waiting: another shard
        assert (len(first), len(second)) == (100, 100)  # a claim spends one shard: 400 / 4
        # every shard held elsewhere: this claim has no tokens (not an unlimited queue)
        other.execute("SELECT * FROM queue_buckets WHERE queue = 'big' FOR UPDATE")
        assert claim(conn, ["big"], 150, "c", now=T0) == []
        other.commit()
    assert len(claim(conn, ["big"], 150, "d", now=T0)) == 100
    assert len(claim(conn, ["big"], 150, "e", now=T0)) == 100
    assert claim(conn, ["big"], 150, "f", now=T0) == []  # the burst is spent: 400 in all
    assert len(claim(conn, ["big"], 150, "g", now=T0 + timedelta(seconds=1))) == 2  # 10/s over 4 shards


def test_queue_api_put_and_get(api: httpx.Client) -> None:
    api.post("/jobs", json={"task": "echo", "queue": "emails"})
    put = api.put("/queues/emails", json={"rate_per_second": 2.5, "paused": True})
    assert put.status_code == 200, put.text
    assert put.json() == {"queue": "emails", "paused": True, "rate_per_second": 2.5, "burst": 3}
    items = {i["queue"]: i for i in api.get("/queues").json()["items"]}
    assert items["emails"]["paused"] and items["emails"]["rate_per_second"] == 2.5
    assert items["emails"]["counts"]["pending"] == 1
    assert api.put("/queues/emails", json={"paused": False}).json()["paused"] is False
    assert api.put("/queues/new-q", json={"burst": 5, "rate_per_second": 1}).json()["burst"] == 5
    assert_error(api.put("/queues/emails", json={"rate_per_second": -1}), 422, "rate_per_second")
    assert_error(api.put("/queues/emails", json={"pause": True}), 422, "pause")
    assert_error(api.put("/queues/unlimited", json={"burst": 5}), 422, "burst")
    assert "unlimited" not in {q["queue"] for q in api.get("/queues").json()["items"]}


# --------------------------------------------------------------------------- concurrency keys

def test_concurrency_limit_holds_and_other_keys_are_not_blocked(conn: psycopg.Connection) -> None:
    tenant_a = [make_job(conn, concurrency_key="a", concurrency_limit=2, priority=5) for _ in range(20)]
    other = [make_job(conn, concurrency_key="b", concurrency_limit=1) for _ in range(3)]
    plain = make_job(conn)
    # (a claim takes half the keys at most, so that claimers at once share them: claim again)
    first = [c for _ in range(3) for c in claim(conn, ["default"], 100, "w")]
    assert {c.id for c in first} == set(tenant_a[:2]) | {other[0], plain}
    assert claim(conn, ["default"], 100, "w") == []  # every key at its limit
    done = next(c for c in first if c.id == tenant_a[0])
    complete(conn, [Report(done.id, done.attempt)], actor="w")
    again = [c for _ in range(2) for c in claim(conn, ["default"], 100, "w")]
    assert [c.id for c in again] == [tenant_a[2]]
    assert conn.execute("SELECT running FROM concurrency_running WHERE key = 'a'").fetchone()["running"] == 2
    assert conn.execute("SELECT concurrency_compact() AS n").fetchone()["n"] >= 0
    assert conn.execute("SELECT running FROM concurrency_running WHERE key = 'a'").fetchone()["running"] == 2
    assert conn.execute("SELECT count(*) AS n FROM concurrency_releases").fetchone()["n"] == 1


def test_concurrency_key_needs_its_limit(api: httpx.Client) -> None:
    assert_error(api.post("/jobs", json={"task": "echo", "concurrency_key": "k"}), 422, "concurrency_limit")
    assert_error(api.post("/jobs", json={"task": "echo", "concurrency_key": "k", "concurrency_limit": 0}), 422,
                 "concurrency_limit")
    job = api.post("/jobs", json={"task": "echo", "concurrency_key": "k", "concurrency_limit": 3,
                                  "fairness_key": "t-1"}).json()
    assert (job["concurrency_key"], job["concurrency_limit"], job["fairness_key"]) == ("k", 3, "t-1")
    step = api.post("/workflows", json={"name": "w", "steps": [
        {"step": "a", "task": "echo", "concurrency_key": "k", "concurrency_limit": 1, "fairness_key": "t-2"}]})
    assert step.status_code == 201, step.text
    job_id = step.json()["steps"][0]["job_id"]
    assert api.get(f"/jobs/{job_id}").json()["fairness_key"] == "t-2"


# --------------------------------------------------------------------------- fairness

def test_fairness_takes_keys_round_robin_on_a_mixed_backlog(conn: psycopg.Connection) -> None:
    big = [make_job(conn, fairness_key="big", now=T0) for _ in range(30)]
    small = [make_job(conn, fairness_key="small", now=T0 + timedelta(seconds=1)) for _ in range(2)]
    plain = [make_job(conn, now=T0 + timedelta(seconds=2))]
    urgent = make_job(conn, fairness_key="big", priority=1, now=T0 + timedelta(seconds=3))
    order = [c.id for c in claim(conn, ["default"], 8, "w", now=T0 + timedelta(seconds=5))]
    # the higher priority first; then one job per key in turn while keys have jobs (urgent
    # was big's first turn; jobs without a key count as one more key). A claim takes at
    # most its share of the batch from each fairness key (8 / 3 keys, and a turn more):
    # big's fifth job waits for the next claim.
    assert order == [urgent, plain[0], small[0], big[0], small[1], big[1], big[2]]
    assert [c.id for c in claim(conn, ["default"], 2, "w", now=T0 + timedelta(seconds=6))] == [big[3], big[4]]


def _generic_plan_indexes(conn: psycopg.Connection, query: str, params: dict, cte: str) -> set[str]:
    """The indexes the generic plan of `query` (as a worker runs it) reads in CTE `cte`."""
    names: list[str] = []
    text = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m[1]) + 1}" if m[1] in names
                  else (names.append(m[1]) or f"${len(names)}"), query).replace("%%", "%")
    args = ", ".join(psycopg.sql.Literal(params[name]).as_string(conn) for name in names)
    with conn.cursor(row_factory=psycopg.rows.tuple_row) as cur:
        cur.execute("SET plan_cache_mode = force_generic_plan")
        cur.execute("PREPARE generic_claim AS " + text)
        try:
            [(plan,)] = cur.execute(f"EXPLAIN (FORMAT JSON) EXECUTE generic_claim({args})").fetchall()
        finally:
            cur.execute("DEALLOCATE generic_claim")
            cur.execute("RESET plan_cache_mode")

    def walk(node: dict, inside: bool) -> Iterator[str]:
        inside = inside or node.get("Subplan Name") == f"CTE {cte}"
        if inside and "Index Name" in node:
            yield node["Index Name"]
        for child in node.get("Plans", []):
            yield from walk(child, inside)

    return set(walk(plan[0]["Plan"], False))


def test_a_newcomer_key_is_claimed_through_its_own_index_whatever_the_statistics(conn: psycopg.Connection) -> None:
    # Analyzed while tenant A's backlog is all there is, the column's statistics hold one key. The
    # claim must still find tenant B's job through jobs_claim_fair (B's own entries), not by
    # walking A's backlog in jobs_pending_flow (migration 0018). PostgreSQL 15 chose the walk
    # without the migration's estimate (18 did not); the estimate is checked on any version.
    enqueue(conn, [JobSpec(task="echo", fairness_key="A") for _ in range(5000)], actor="test")
    conn.execute("ANALYZE jobs")
    distinct = conn.execute("SELECT attname, n_distinct FROM pg_stats WHERE tablename = 'jobs'"
                            " AND attname IN ('fairness_key', 'concurrency_key')").fetchall()
    assert {row["attname"]: row["n_distinct"] for row in distinct} == {"fairness_key": -0.05,
                                                                      "concurrency_key": -0.05}
    [b] = enqueue(conn, [JobSpec(task="echo", fairness_key="B")], actor="test")
    params = {"queues": ["default"], "limit": 8, "worker": "w", "now": None}
    assert _generic_plan_indexes(conn, q("job_claim"), params, "fair") == {"jobs_claim_fair"}
    assert b.id in {c.id for c in claim(conn, ["default"], 2, "w")}
