"""Bulk cancel and retry (POST /jobs/cancel, POST /jobs/retry) through a real `qforge api`:
every matching job, in bounded batches whose id each event carries, and nothing else."""

from __future__ import annotations

import json
from uuid import UUID

import httpx
import psycopg
import pytest

from openapi_check import assert_matches
from qforge.commands import tokens
from qforge.commands.bulk import BATCH_SIZE
from qforge.commands.claim import claim
from qforge.commands.enqueue import enqueue
from qforge.commands.report import Report, fail
from qforge.commands.specs import JobSpec
from qforge.producer import submit
from remote_support import Remote, api, cli, rconn  # noqa: F401 (fixtures)

conn = rconn  # the database the shared `qforge api` serves

def add(conn, count: int, **options) -> list[UUID]:
    return [o.id for o in enqueue(conn, [JobSpec(**{"task": "echo", **options}) for _ in range(count)], actor="test")]


def statuses(conn, ids: list[UUID]) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) AS n FROM jobs WHERE id = ANY(%s) GROUP BY status",
                        [ids]).fetchall()
    return {row["status"]: row["n"] for row in rows}


def batch_sizes(conn, event_type: str, ids: list[UUID]) -> list[int]:
    rows = conn.execute("SELECT data->>'batch_id' AS batch, count(*) AS n FROM events WHERE type = %s"
                        " AND stream_id = ANY(%s) GROUP BY 1 ORDER BY 1", [event_type, ids]).fetchall()
    assert all(row["batch"] for row in rows), f"a {event_type} without its batch's id"
    return [row["n"] for row in rows]


def test_cancel_then_retry_every_job_of_a_bad_deploy_in_bounded_batches(conn: psycopg.Connection,
                                                                         api: httpx.Client) -> None:
    bad = add(conn, 1234, queue="emails", tags={"deploy": "d-42"})
    other_deploy = add(conn, 20, queue="emails", tags={"deploy": "d-41"})
    other_queue = add(conn, 20, tags={"deploy": "d-42"})
    spec = api.get("/openapi.json").json()
    body = {"filter": {"queue": "emails", "tags": {"deploy": "d-42"}}}

    counted = api.post("/jobs/cancel", json={**body, "dry_run": True})
    assert counted.status_code == 200, counted.text
    assert counted.json() == {"count": 1234, "next": None}
    assert statuses(conn, bad) == {"pending": 1234}, "a dry run changed something"

    done = api.post("/jobs/cancel", json=body)
    assert done.status_code == 200, done.text
    assert_matches(spec, "POST", "/jobs/cancel", 200, done.json())
    assert done.json()["count"] == 1234
    assert statuses(conn, bad) == {"cancelled": 1234}
    assert statuses(conn, other_deploy + other_queue) == {"pending": 40}
    sizes = batch_sizes(conn, "Cancelled", bad)
    assert sum(sizes) == 1234 and max(sizes) <= BATCH_SIZE and len(sizes) == -(-1234 // BATCH_SIZE), sizes

    again = api.post("/jobs/cancel", json=body)
    assert again.json()["count"] == 0, "a cancelled job was cancelled twice"

    retried = api.post("/jobs/retry", json={"filter": {"status": "cancelled", "tags": {"deploy": "d-42"}}})
    assert retried.status_code == 200, retried.text
    assert retried.json()["count"] == 1234
    assert statuses(conn, bad) == {"pending": 1234}
    assert sum(batch_sizes(conn, "Retried", bad)) == 1234
    assert statuses(conn, other_deploy + other_queue) == {"pending": 40}


def test_limit_and_after_go_through_the_matches_in_parts(conn: psycopg.Connection, api: httpx.Client) -> None:
    ids = add(conn, 25, queue="parts")
    seen, after, rounds = 0, None, 0
    while True:
        answer = api.post("/jobs/cancel", json={"filter": {"queue": "parts"}, "limit": 10,
                                                **({"after": after} if after else {})}).json()
        seen += answer["count"]
        rounds += 1
        after = answer["next"]
        if after is None:
            break
    assert (seen, rounds) == (25, 3)
    assert statuses(conn, ids) == {"cancelled": 25}


def test_a_bulk_retry_reruns_a_dead_workflow_step_as_its_own_retry_does(conn: psycopg.Connection,
                                                                        api: httpx.Client) -> None:
    workflow_id = submit(conn, {"name": "w", "tags": {"team": "a"}, "steps": [
        {"step": "first", "task": "fail", "max_retries": 0, "queue": "wf"},
        {"step": "second", "task": "echo", "depends_on": ["first"], "queue": "wf"}]})
    [job] = claim(conn, ["wf"], 1, "w1")
    fail(conn, [Report(job.id, job.attempt, error="boom")], actor="w1")
    assert api.get(f"/workflows/{workflow_id}").json()["status"] == "failed"

    answer = api.post("/jobs/retry", json={"filter": {"task": "fail", "tags": {"team": "a"}}})
    assert answer.json()["count"] == 1, answer.text
    workflow = api.get(f"/workflows/{workflow_id}").json()
    assert workflow["status"] == "running"
    assert {s["step"]: s["status"] for s in workflow["steps"]} == {"first": "pending", "second": "blocked"}
    reopened = conn.execute("SELECT data FROM events WHERE type = 'StepReopened' AND workflow_id = %s",
                            [workflow_id]).fetchall()
    assert reopened and all(row["data"].get("batch_id") for row in reopened)


def test_bad_filters_are_refused_naming_the_field_and_change_nothing(conn: psycopg.Connection,
                                                                     api: httpx.Client) -> None:
    ids = add(conn, 3, queue="refusals")
    for body, field in [({"filter": {"status": "succeeded"}}, "filter.status"),
                        ({"filter": {"status": "sleeping"}}, "filter.status"),
                        ({"filter": {"colour": "red"}}, "filter.colour"),
                        ({"filter": {"tags": {"a:b": "c"}}}, "filter.tags"),
                        ({"filter": {"task": "a\u0000b"}}, "filter.task"),
                        ({"filter": {"tags": {"k": "v\u0000"}}}, "filter.tags"),
                        ({}, "filter"), ({"filter": {"queue": "refusals"}, "limit": 0}, "limit")]:
        answer = api.post("/jobs/cancel", json=body)
        assert answer.status_code == 422, (body, answer.text)
        assert field in answer.text, (body, answer.text)
    assert statuses(conn, ids) == {"pending": 3}


def test_bulk_actions_need_the_operate_scope(conn: psycopg.Connection, api: httpx.Client) -> None:
    ids = add(conn, 2, queue="scoped")
    reader = tokens.create_token(conn, "viewer", "read", actor="test")
    operator = tokens.create_token(conn, "ops", "operate", actor="test")
    body = {"filter": {"queue": "scoped"}}
    refused = api.post("/jobs/cancel", json=body, headers={"Authorization": f"Bearer {reader}"})
    assert refused.status_code == 403
    assert statuses(conn, ids) == {"pending": 2}
    done = api.post("/jobs/cancel", json=body, headers={"Authorization": f"Bearer {operator}"})
    assert done.json()["count"] == 2
    actors = {row["actor"] for row in conn.execute(
        "SELECT actor FROM events WHERE type = 'Cancelled' AND stream_id = ANY(%s)", [ids])}
    assert actors == {"ops"}


def test_the_cli_cancels_and_retries_what_matches_and_counts_first(conn: psycopg.Connection,
                                                                    remote: Remote, cli) -> None:
    """The cancel runs the installed `qforge`; the other commands its main() in this process."""
    token = tokens.create_token(conn, "cli-ops", "operate", actor="test")

    def qforge(*args: str, token: str | None = None):
        return cli(*args, token=token)

    bad = add(conn, 1500, task="send_email", tags={"deploy": "d-9"})
    keep = add(conn, 5, task="send_email")

    counted = qforge("jobs", "cancel", "--task", "send_email", "--tag", "deploy:d-9", "--dry-run",
                     "--json", token=token)
    assert counted.returncode == 0, counted.stderr
    assert json.loads(counted.stdout) == {"count": 1500}
    done = remote.qforge("jobs", "cancel", "--task", "send_email", "--tag", "deploy:d-9", "--json", token=token)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"count": 1500}
    assert done.stderr == "", "progress written although stderr is not a terminal"
    assert statuses(conn, bad) == {"cancelled": 1500} and statuses(conn, keep) == {"pending": 5}

    unfiltered = qforge("jobs", "retry", token=token)
    assert unfiltered.returncode == 2 and "--all-matching" in unfiltered.stderr
    people = qforge("jobs", "retry", "--status", "cancelled", "--task", "send_email", token=token)
    assert people.returncode == 0, people.stderr
    assert people.stdout.strip() == "retried 1500 jobs"
    assert statuses(conn, bad) == {"pending": 1500}

    without_token = qforge("jobs", "cancel", "--all-matching")
    assert without_token.returncode == 1 and "401" in without_token.stderr
    refused = qforge("jobs", "cancel", "--status", "dead", token=token)
    assert refused.returncode == 2 and "filter.status" in refused.stderr, refused.stderr


def test_the_client_counts_cancels_and_retries_in_parts(conn: psycopg.Connection, api: httpx.Client) -> None:
    from qforge import Client, Invalid

    ids = add(conn, 30, queue="sdk")
    with Client(str(api.base_url), token=api.headers["Authorization"].split()[1]) as client:
        assert client.cancel_matching(queue="sdk", dry_run=True).count == 30
        part = client.cancel_matching(queue="sdk", limit=20)
        assert (part.count, part.next is not None) == (20, True)
        rest = client.cancel_matching(queue="sdk", after=part.next)
        assert (rest.count, rest.next) == (10, None)
        assert client.retry_matching(queue="sdk", status="cancelled").count == 30
        with pytest.raises(Invalid):
            client.retry_matching(status="nonsense")
    assert statuses(conn, ids) == {"pending": 30}
