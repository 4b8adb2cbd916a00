"""Stored definitions (issue 15): versions as events, runs from the latest version, validation, replay."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from qforge.workflows.definitions import DefinitionSpec, store_definition, stream_id
from qforge.workflows.engine import start_definition
from qforge.commands.errors import Invalid, NotFound
from qforge.events import store
from qforge.projections import replay
from qforge.projections.workflows import get_workflow
from tests.test_api import assert_error, serve
from tests.test_workflows import run_ready, steps_of

REPORT = {"retry_policy": {"max_retries": 5, "backoff_base_seconds": 2, "backoff_cap_seconds": 60},
          "result": {"step": "report"}, "tags": {"team": "data"}, "steps": [
              {"step": "load", "task": "echo"},
              {"step": "report", "task": "echo", "depends_on": ["load"], "max_retries": 0}]}


@pytest.fixture
def api(db_url: str) -> Iterator[httpx.Client]:
    yield from serve(db_url, api_token=None)


def test_put_stores_versions_and_get_reads_latest_or_one(api):
    first = api.put("/definitions/report", json=REPORT)
    assert first.status_code == 201, first.text
    assert (first.json()["version"], first.json()["latest_version"]) == (1, 1)
    second = api.put("/definitions/report", json={**REPORT, "deadline_seconds": 60})
    assert (second.status_code, second.json()["version"]) == (200, 2)
    assert api.get("/definitions/report").json()["document"]["deadline_seconds"] == 60
    old = api.get("/definitions/report", params={"version": 1}).json()
    assert (old["version"], old["latest_version"], "deadline_seconds" in old["document"]) == (1, 2, False)
    assert_error(api.get("/definitions/report", params={"version": 9}), 404, "version 9")
    assert_error(api.get("/definitions/nope"), 404, "nope")
    listed = api.get("/definitions").json()
    assert [(d["name"], d["version"]) for d in listed["items"]] == [("report", 2)]


def test_an_invalid_definition_lists_every_problem_and_stores_nothing(api):
    body = {"steps": [{"step": "a", "task": "echo", "depends_on": ["ghost"]},
                      {"step": "b", "type": "teleport"}], "result": {"step": "nowhere"}}
    error = assert_error(api.put("/definitions/bad", json=body), 422, "ghost", "teleport", "nowhere")
    assert len(error["details"]) >= 3
    assert_error(api.put("/definitions/bad", json={**REPORT, "retry_policy": {"max_retries": -1}}), 422,
                 "max_retries")
    assert_error(api.put("/definitions/bad name", json=REPORT), 404, "name")  # as any malformed id
    assert api.get("/definitions").json()["items"] == []


def test_a_run_uses_the_latest_version_its_retry_policy_and_gives_roots_the_inputs(api, conn):
    first = api.put("/definitions/report", json={**REPORT, "result": None, "steps": REPORT["steps"][:1]})
    assert first.status_code == 201
    api.put("/definitions/report", json=REPORT)
    run = api.post("/definitions/report/runs", json={"inputs": {"day": "2031-01-01"}, "tags": {"run": "1"}})
    assert run.status_code == 201, run.text
    workflow = run.json()
    assert workflow["definition"] == {"name": "report", "version": 2}
    assert workflow["tags"] == {"team": "data", "run": "1"}
    rows = steps_of(conn, workflow["id"])
    assert rows["load"]["payload"] == {"inputs": {"day": "2031-01-01"}}
    assert (rows["load"]["max_retries"], rows["load"]["backoff_base_seconds"],
            rows["load"]["backoff_cap_seconds"]) == (5, 2, 60)
    assert rows["report"]["max_retries"] == 0  # a step's own setting wins
    run_ready(conn), run_ready(conn)
    done = api.get(f"/workflows/{workflow['id']}").json()
    assert done["status"] == "succeeded"
    assert done["result"] == {"step": "report"}  # what the test worker returned for it
    assert_error(api.post("/definitions/nope/runs", json={}), 404, "nope")
    assert_error(api.post("/definitions/report/runs", json={"inputs": [1]}), 422, "inputs")


def test_start_definition_is_idempotent_by_key_and_raises_domain_errors(conn):
    store_definition(conn, "nightly", DefinitionSpec.model_validate(REPORT))
    first = start_definition(conn, "nightly", {"a": 1}, actor="scheduler", idempotency_key="k1")
    again = start_definition(conn, "nightly", {"a": 1}, actor="scheduler", idempotency_key="k1")
    assert first == again
    assert get_workflow(conn, first)["definition"] == {"name": "nightly", "version": 1}
    with pytest.raises(NotFound):
        start_definition(conn, "missing", None, actor="scheduler")
    with pytest.raises(Invalid):
        start_definition(conn, "nightly", [1], actor="scheduler")  # type: ignore[arg-type]


def test_definitions_are_events_and_replay_rebuilds_them(conn):
    store_definition(conn, "d", DefinitionSpec.model_validate(REPORT))
    stored = store_definition(conn, "d", DefinitionSpec.model_validate({**REPORT, "tags": {}}))
    assert stored["version"] == 2
    events = store.read_stream(conn, stream_id("d"))
    assert [(e.type, e.version, e.stream_type) for e in events] == [
        ("DefinitionStored", 1, "definition"), ("DefinitionStored", 2, "definition")]
    assert replay.verify(conn) == []
    conn.execute("UPDATE definition_versions SET document = '{}' WHERE version = 1")
    differences = replay.verify(conn)
    assert [d.table for d in differences] == ["definition_versions"]
