"""Pinned versions of stored definitions through a real `qforge api`: a run and a schedule may
name the version they run, and the workflow records the version it ran."""

from __future__ import annotations

from datetime import timedelta

import httpx
import psycopg

from openapi_check import assert_matches
from qforge.commands import schedules
from qforge.commands.schedules import fire_due
from remote_support import api, rconn  # noqa: F401 (fixtures)

conn = rconn

V1 = {"steps": [{"step": "old", "task": "echo"}]}
V2 = {"steps": [{"step": "new", "task": "echo"}, {"step": "newer", "task": "echo", "depends_on": ["new"]}]}


def store_two_versions(api: httpx.Client, name: str) -> None:
    assert api.put(f"/definitions/{name}", json=V1).status_code == 201
    assert api.put(f"/definitions/{name}", json=V2).status_code == 200


def test_a_run_takes_the_version_it_names_and_the_workflow_records_it(api: httpx.Client) -> None:
    store_two_versions(api, "report")
    spec = api.get("/openapi.json").json()
    pinned = api.post("/definitions/report/runs", json={"version": 1, "inputs": {"day": 3}})
    assert pinned.status_code == 201, pinned.text
    assert_matches(spec, "POST", "/definitions/{name}/runs", 201, pinned.json())
    assert pinned.json()["definition"] == {"name": "report", "version": 1}
    assert [s["step"] for s in pinned.json()["steps"]] == ["old"]
    again = api.get(f"/workflows/{pinned.json()['id']}").json()
    assert again["definition"] == {"name": "report", "version": 1}

    latest = api.post("/definitions/report/runs", json={"inputs": {}}).json()
    assert latest["definition"] == {"name": "report", "version": 2}
    assert sorted(s["step"] for s in latest["steps"]) == ["new", "newer"]

    missing = api.post("/definitions/report/runs", json={"version": 3})
    assert missing.status_code == 404 and "version 3" in missing.json()["message"]
    for bad in (0, "two", -1):
        refused = api.post("/definitions/report/runs", json={"version": bad})
        assert refused.status_code == 422 and "version" in refused.text, refused.text


def test_a_schedule_pins_a_version_for_every_tick_until_unpinned(api: httpx.Client, conn: psycopg.Connection) -> None:
    store_two_versions(api, "nightly")
    refused = api.post("/schedules", json={"name": "nightly-bad", "cron": "* * * * * *",
                                           "definition": "nightly", "version": 9})
    assert refused.status_code == 422 and "version" in refused.json()["message"], refused.text
    job_pinned = api.post("/schedules", json={"name": "job-bad", "cron": "* * * * * *",
                                              "job": {"task": "echo"}, "version": 1})
    assert job_pinned.status_code == 422 and "version" in job_pinned.text

    created = api.post("/schedules", json={"name": "nightly-v1", "cron": "* * * * * *",
                                           "definition": "nightly", "version": 1})
    assert created.status_code == 201, created.text
    assert created.json()["version"] == 1
    due = schedules.get_schedule(conn, "nightly-v1")["next_fire_at"]
    fire_due(conn, actor="monitor", grace_seconds=60, now=due)
    first = schedules.get_schedule(conn, "nightly-v1")["last_execution_id"]
    assert api.get(f"/workflows/{first}").json()["definition"] == {"name": "nightly", "version": 1}

    unpinned = api.patch("/schedules/nightly-v1", json={"version": None})
    assert unpinned.status_code == 200, unpinned.text
    assert unpinned.json().get("version") is None
    fire_due(conn, actor="monitor", grace_seconds=60, now=due + timedelta(seconds=5))  # a later tick
    second = schedules.get_schedule(conn, "nightly-v1")["last_execution_id"]
    assert second != first
    assert api.get(f"/workflows/{second}").json()["definition"] == {"name": "nightly", "version": 2}
    api.delete("/schedules/nightly-v1")
