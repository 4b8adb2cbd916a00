"""Fairness across claims and per-key limits (issue 29 items 4 and 5): the rotation, weights, a key's
configured concurrency limit and rate, and PUT/GET /keys with their validation, events and replay."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Iterator
from uuid import UUID

import httpx
import jsonschema
import psycopg
import pytest

from qforge.commands.claim import claim
from qforge.commands.enqueue import enqueue
from qforge.commands.keys import KeySettingsSpec, configure_key
from qforge.commands.report import Report, complete
from qforge.commands.specs import JobSpec
from qforge.projections import replay
from tests.test_api import assert_error, serve

T0 = datetime(2031, 1, 1, tzinfo=timezone.utc)


def jobs(conn: psycopg.Connection, count: int, *, now: datetime = T0, **fields) -> list[UUID]:
    return [e.id for e in enqueue(conn, [JobSpec(task="echo", **fields) for _ in range(count)], now=now)]


def one_slot_order(conn: psycopg.Connection, claims: int, *, queues=("default",), start: datetime = T0,
                   size: int = 1) -> list[UUID]:
    """The jobs `claims` claims of `size` take, each a millisecond after the last (as a worker's)."""
    order: list[UUID] = []
    for n in range(claims):
        got = claim(conn, list(queues), size, "w", now=start + timedelta(seconds=10, milliseconds=n))
        order += [job.id for job in got]
    return order


def keys_of(order: list[UUID], by_key: dict[str, list[UUID]]) -> str:
    owner = {job: key for key, ids in by_key.items() for job in ids}
    return "".join(owner[job] for job in order)


# --------------------------------------------------------------------------- the rotation


def test_a_one_slot_claimer_alternates_between_keys_with_due_jobs(conn: psycopg.Connection) -> None:
    a = jobs(conn, 60, fairness_key="A")
    b = jobs(conn, 5, fairness_key="B", now=T0 + timedelta(seconds=1))  # due a moment later
    order = one_slot_order(conn, 16)
    assert keys_of(order, {"A": a, "B": b}) == "ABABABABAB" + "A" * 6
    assert order[1:10:2] == b and [job for job in order if job in a] == a[:11]  # each key in its order


def test_a_claim_of_n_continues_the_rotation_where_the_last_left_off(conn: psycopg.Connection) -> None:
    by_key = {key: jobs(conn, 10, fairness_key=key) for key in "ABCD"}
    order = [keys_of(one_slot_order(conn, 1, size=2, start=T0 + timedelta(seconds=n)), by_key) for n in range(4)]
    assert order == ["AB", "CD", "AB", "CD"]
    assert keys_of(one_slot_order(conn, 1, size=3, start=T0 + timedelta(seconds=5)), by_key) == "ABC"
    assert keys_of(one_slot_order(conn, 1, size=5, start=T0 + timedelta(seconds=6)), by_key) == "DABCD"


def test_weight_gives_a_key_that_many_turns_per_rotation(conn: psycopg.Connection) -> None:
    configure_key(conn, "B", KeySettingsSpec(weight=3), now=T0)
    by_key = {"A": jobs(conn, 20, fairness_key="A"), "B": jobs(conn, 20, fairness_key="B")}
    assert keys_of(one_slot_order(conn, 12), by_key) == "ABBBABBBABBB"
    # a claim of 8 takes the same turns: 2 of A, 6 of B
    assert sorted(keys_of(one_slot_order(conn, 1, size=8, start=T0 + timedelta(seconds=1)), by_key)) == list("AABBBBBB")


def test_a_key_back_after_a_pause_gets_one_turn_ahead_not_a_credit(conn: psycopg.Connection) -> None:
    by_key = {"B": jobs(conn, 3, fairness_key="B")}
    by_key["A"] = jobs(conn, 40, fairness_key="A")
    assert keys_of(one_slot_order(conn, 26), by_key) == "ABABAB" + "A" * 20  # B ran dry: A alone
    by_key["B"] += jobs(conn, 5, fairness_key="B", now=T0 + timedelta(seconds=5))  # B is back
    by_key["C"] = jobs(conn, 5, fairness_key="C", now=T0 + timedelta(seconds=5))  # C is new
    order = keys_of(one_slot_order(conn, 9, start=T0 + timedelta(seconds=20)), by_key)
    assert sorted(order[:3]) == list("ABC") and order[3:] == order[:3] * 2  # rotating, no key twice in a row


def test_jobs_without_a_key_count_as_one_more_key_across_claims(conn: psycopg.Connection) -> None:
    by_key = {"A": jobs(conn, 10, fairness_key="A"), "-": jobs(conn, 10)}
    order = keys_of(one_slot_order(conn, 6), by_key)
    assert order.count("A") == 3 and order.count("-") == 3, order


# --------------------------------------------------------------------------- limits set centrally


def test_a_keys_configured_limit_replaces_its_jobs_and_clearing_it_restores_theirs(conn: psycopg.Connection) -> None:
    jobs(conn, 10, concurrency_key="k", concurrency_limit=5)
    configure_key(conn, "k", KeySettingsSpec(concurrency_limit=2), now=T0)
    first = claim(conn, ["default"], 10, "w", now=T0 + timedelta(seconds=1))
    assert len(first) == 2
    # a producer's job saying 9 changes nothing while the key is configured
    jobs(conn, 1, concurrency_key="k", concurrency_limit=9)
    assert claim(conn, ["default"], 10, "w", now=T0 + timedelta(seconds=2)) == []
    assert conn.execute("SELECT lim, running FROM concurrency_running WHERE key = 'k'").fetchone() == \
        {"lim": 2, "running": 2}
    configure_key(conn, "k", KeySettingsSpec(concurrency_limit=None), now=T0)
    assert len(claim(conn, ["default"], 10, "w", now=T0 + timedelta(seconds=3))) == 7  # the jobs' 9, less 2
    complete(conn, [Report(job.id, job.attempt) for job in first], actor="w")
    assert replay.verify(conn) == []


def test_a_keys_rate_limit_holds_across_queues(conn: psycopg.Connection) -> None:
    configure_key(conn, "r", KeySettingsSpec(rate_per_second=2), now=T0)  # burst: one second's worth
    for queue in ("q1", "q2"):
        jobs(conn, 10, fairness_key="r", queue=queue)
    jobs(conn, 10, concurrency_key="r", concurrency_limit=100, queue="q2")
    at = T0 + timedelta(seconds=1)
    assert len(claim(conn, ["q1"], 10, "w", now=at)) == 2
    assert claim(conn, ["q2"], 10, "w", now=at) == []  # the same key's tokens, spent in q1
    got = claim(conn, ["q1", "q2"], 10, "w", now=at + timedelta(seconds=1))
    assert len(got) == 2
    # four seconds of refill at 2/s, but no more than the burst of 2 at once
    assert len(claim(conn, ["q2"], 10, "w", now=at + timedelta(seconds=5))) == 2
    plain = jobs(conn, 3, queue="q2")  # jobs without the key are not held back
    assert {j.id for j in claim(conn, ["q2"], 10, "w", now=at + timedelta(seconds=5))} == set(plain)


def test_configuring_a_key_writes_one_event_per_change_and_replays(conn: psycopg.Connection) -> None:
    configure_key(conn, "k", KeySettingsSpec(concurrency_limit=3, weight=2), now=T0, actor="alice")
    configure_key(conn, "k", KeySettingsSpec(weight=2), now=T0)  # no change: no event
    configure_key(conn, "k", KeySettingsSpec(rate_per_second=1.5, burst=4), now=T0)
    rows = conn.execute("SELECT stream_type, version, type, data, actor FROM events WHERE stream_type = 'key'"
                        " ORDER BY position").fetchall()
    assert [(r["version"], r["type"], r["actor"]) for r in rows] == [(1, "KeyConfigured", "alice"),
                                                                     (2, "KeyConfigured", "api")]
    assert rows[1]["data"]["concurrency_limit"] == 3 and rows[1]["data"]["burst"] == 4
    assert replay.verify(conn) == []
    conn.execute("UPDATE key_settings SET weight = 7")  # a projection that drifted from its log
    problems = replay.verify(conn)
    assert problems and any("key_settings" in str(p) for p in problems), problems


# --------------------------------------------------------------------------- the API


@pytest.fixture
def api(db_url: str) -> Iterator[httpx.Client]:
    yield from serve(db_url, api_token=None)


def conforms(api: httpx.Client, schema_name: str, body: object) -> None:
    """`body` is what /openapi.json says `schema_name` is."""
    spec = api.get("/openapi.json").json()
    jsonschema.validate(body, {"$ref": f"#/components/schemas/{schema_name}", "components": spec["components"]})


def test_put_and_get_keys_over_http(api: httpx.Client, conn: psycopg.Connection) -> None:
    assert_error(api.get("/keys/tenant-1"), 404, "tenant-1")
    put = api.put("/keys/tenant-1", json={"concurrency_limit": 4, "weight": 2})
    assert put.status_code == 200, put.text
    conforms(api, "KeyView", put.json())
    assert {k: put.json()[k] for k in ("key", "configured", "concurrency_limit", "weight", "rate_per_second",
                                       "burst")} == {"key": "tenant-1", "configured": True, "concurrency_limit": 4,
                                                     "weight": 2, "rate_per_second": None, "burst": None}
    put = api.put("/keys/tenant-1", json={"rate_per_second": 2.5}).json()
    assert (put["concurrency_limit"], put["weight"], put["rate_per_second"], put["burst"]) == (4, 2, 2.5, 3)
    api.post("/jobs", json={"task": "echo", "concurrency_key": "other", "concurrency_limit": 3})
    listed = api.get("/keys").json()
    conforms(api, "KeyList", listed)
    assert [(k["key"], k["configured"], k["concurrency_limit_in_force"]) for k in listed["items"]] == [
        ("other", False, 3), ("tenant-1", True, 4)]
    assert api.get("/keys", params={"limit": 1}).json()["next"] == "other"
    assert [k["key"] for k in api.get("/keys", params={"cursor": "other"}).json()["items"]] == ["tenant-1"]
    events = api.get("/keys/tenant-1/events").json()["events"]
    assert [(e["type"], e["stream_type"], e["version"]) for e in events] == [("KeyConfigured", "key", 1),
                                                                            ("KeyConfigured", "key", 2)]
    assert api.get("/keys/other").json()["configured"] is False


BAD_BODIES = [
    ({"weight": 0}, "weight"), ({"weight": "3"}, "weight"), ({"weight": None}, "weight"),
    ({"concurrency_limit": 0}, "concurrency_limit"), ({"concurrency_limit": 1.5}, "concurrency_limit"),
    ({"rate_per_second": -1}, "rate_per_second"), ({"rate_per_second": True}, "rate_per_second"),
    ({"burst": 0}, "burst"), ({"burst": 5}, "burst"), ({"colour": "red"}, "colour"),
]


def test_a_bad_key_body_is_a_422_naming_the_field_and_stores_nothing(api: httpx.Client,
                                                                     conn: psycopg.Connection) -> None:
    for body, field in BAD_BODIES:  # one server for all (a server a case cost a second each)
        assert_error(api.put("/keys/k", json=body), 422, field)
    assert conn.execute("SELECT count(*) AS n FROM events WHERE stream_type = 'key'").fetchone()["n"] == 0
    assert_error(api.put("/keys/" + "x" * 201, json={"weight": 2}), 404, "name", "200 characters")
