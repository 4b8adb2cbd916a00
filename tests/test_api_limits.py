"""Bounded by design (issue 30): each limit of the API hit once, over HTTP, each refusal a 4xx
(contract §3 error body) naming its setting, and nothing lost on the way."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Iterator

import httpx
import psycopg
import pytest

from qforge.audit import checkpoints as audit
from qforge.audit import proofs as audit_proof
from qforge.tools.verify_audit_proof import check_proof
from test_auth import serve
from test_worker_support import wait_for


@pytest.fixture
def small_pages(db_url: str) -> Iterator[httpx.Client]:
    yield from serve(db_url, api_page_bytes=4096, api_statement_timeout_seconds=1, api_streams_per_token=2)


def walk(client: httpx.Client, path: str, key: str, cursor_param: str, **params) -> list[list[dict]]:
    pages, cursor = [], None
    while True:
        body = client.get(path, params={**params, **({cursor_param: cursor} if cursor else {})}).json()
        pages.append(body[key])
        cursor = body["next"]
        if not body[key] or (key == "items" and cursor is None):
            return pages


def test_pages_are_bounded_by_bytes_and_lose_nothing(small_pages):
    client = small_pages
    ids = [client.post("/jobs", json={"task": "echo", "payload": {"blob": "x" * 1500, "n": n},
                                      "tags": {"batch": "b"}}).json()["id"] for n in range(8)]
    flows = [client.post("/workflows", json={"name": "w", "tags": {"batch": "b"}, "steps": [
        {"step": "a", "type": "wait_for_trigger"}]}).json()["id"] for _ in range(3)]

    pages = walk(client, "/jobs", "items", "cursor", limit=500, task="echo")
    assert len(pages) >= 4 and all(1 <= len(page) <= 2 for page in pages)  # ~1.6 KB a job, 4 KB a page
    assert [job["id"] for page in pages for job in page] == ids[::-1]

    pages = walk(client, "/events", "events", "after", after="0", limit=1000)
    enqueued = [e["stream_id"] for page in pages for e in page if e["type"] == "Enqueued"]
    assert [i for i in enqueued if i in ids] == ids
    assert max(len(page) for page in pages) < 11 and len([p for p in pages if p]) >= 4
    positions = [e["position"] for page in pages for e in page]
    assert len(positions) == len(set(positions))  # every event once

    # /executions: newest first across both kinds, paged in the database, bounded by bytes.
    pages = walk(client, "/executions", "items", "cursor", tag="batch:b", limit=500)
    found = [item["id"] for page in pages for item in page]
    assert sorted(found, reverse=True) == found and set(ids) | set(flows) <= set(found)  # steps carry tags too
    assert len(found) == len(set(found))
    assert len(pages) >= 3
    small = walk(client, "/executions", "items", "cursor", tag="batch:b", limit=2)
    assert [item["id"] for page in small for item in page] == found


def test_a_statement_over_the_timeout_is_stopped_with_a_4xx(small_pages, db_url):
    client = small_pages
    held = threading.Event()
    done = threading.Event()

    def hold_lock() -> None:
        with psycopg.connect(db_url) as conn:
            conn.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold_lock)
    holder.start()
    try:
        assert held.wait(10)
        started = time.monotonic()
        response = client.get("/jobs")
        assert response.status_code == 422, response.text
        assert response.json()["error"] == "statement_timeout"
        assert "QFORGE_API_STATEMENT_TIMEOUT_SECONDS" in response.json()["message"]
        assert time.monotonic() - started < 10
    finally:
        done.set()
        holder.join()
    assert client.get("/jobs").status_code == 200  # the pool's connection goes on


def test_streams_per_token_are_capped(small_pages):
    client = small_pages
    with client.stream("GET", "/events/stream") as first, client.stream("GET", "/events/stream") as second:
        assert first.status_code == second.status_code == 200
        refused = client.get("/events/stream")
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"] == "too_many_streams"
        assert "QFORGE_API_STREAMS_PER_TOKEN" in refused.json()["message"]

    def opens() -> bool:
        with client.stream("GET", "/events/stream") as again:
            return again.status_code == 200

    wait_for(opens, timeout=20, message="a stream to open once the others closed")


def test_tags_and_queue_names_are_bounded(small_pages):
    client = small_pages
    many = client.post("/jobs", json={"task": "echo", "tags": {f"k{n}": "v" for n in range(21)}})
    assert many.status_code == 422 and "at most 20" in many.json()["message"], many.text
    assert "tags" in many.json()["details"][0]["field"]
    long_queue = client.post("/jobs", json={"task": "echo", "queue": "q" * 201})
    assert long_queue.status_code == 422 and long_queue.json()["details"][0]["field"] == "queue"
    assert client.post("/jobs", json={"task": "echo", "tags": {f"k{n}": "v" for n in range(20)}}).status_code == 201


def fan_out(client: httpx.Client, payload: dict, items: list) -> dict:
    flow = client.post("/workflows", json={"name": "fan", "steps": [
        {"step": "list", "type": "wait_for_trigger"},
        {"step": "each", "task": "echo", "payload": payload, "for_each": {"step": "list", "path": "items"}}]})
    assert flow.status_code == 201, flow.text
    triggered = client.post(f"/workflows/{flow.json()['id']}/steps/list/trigger", json={"payload": {"items": items}})
    assert triggered.status_code == 200, triggered.text
    return triggered.json()


def test_one_small_request_cannot_fan_out_into_a_gigabyte(db_url, monkeypatch):
    # ~120 KB of request: a 100 KB payload over 10,000 elements would write ~1 GB of copies.
    for client in serve(db_url):
        flow = fan_out(client, {"blob": "x" * 100_000}, list(range(10_000)))
        each = next(s for s in flow["steps"] if s["step"] == "each")
        assert flow["status"] == "failed" and each["status"] == "dead"
        assert "QFORGE_MAX_FAN_OUT_BYTES" in each["error"], each["error"]
        with psycopg.connect(db_url) as conn:
            assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 2  # no element was written

        monkeypatch.setenv("QFORGE_MAX_WORKFLOW_JOBS", "6")
        flow = fan_out(client, {}, list(range(5)))  # 2 steps + 5 elements > 6
        each = next(s for s in flow["steps"] if s["step"] == "each")
        assert each["status"] == "dead" and "QFORGE_MAX_WORKFLOW_JOBS (6)" in each["error"], each["error"]
        flow = fan_out(client, {}, list(range(4)))  # 2 + 4 = 6: allowed
        assert flow["status"] == "running"


def test_proofs_come_in_pages_that_join_into_the_whole_proof(small_pages, conn, tmp_path):
    client = small_pages
    flow = client.post("/workflows", json={"name": "many", "steps": [
        {"step": f"s{n}", "type": "wait_for_trigger"} for n in range(12)]}).json()["id"]
    for n in range(12):
        assert client.post(f"/workflows/{flow}/steps/s{n}/trigger", json={"payload": {"n": n}}).status_code == 200
        audit.checkpoint(conn)  # a checkpoint between each: many headers to page through too
    pages, cursor = [], None
    while True:
        response = client.get(f"/workflows/{flow}/proof", params={"cursor": cursor} if cursor else {})
        assert response.status_code == 200, response.text
        assert len(response.content) < 2 * 4096 + 2048  # about QFORGE_API_PAGE_BYTES (one item may overshoot)
        pages.append(response.json())
        cursor = pages[-1]["next"]
        if cursor is None:
            break
    assert len(pages) >= 3 and any(p["checkpoints"] for p in pages[1:])
    joined = {**pages[0], "events": [e for p in pages for e in p["events"]],
              "checkpoints": [c for p in pages for c in p["checkpoints"]]}
    whole = audit_proof.proof(conn, "workflow", uuid.UUID(flow))
    assert joined["events"] == whole["events"] and joined["checkpoints"] == whole["checkpoints"]
    assert check_proof(joined, whole["checkpoints"][-1]) == []
    assert "pages" in pages[0]["status"]["problems"][0]
    bad = client.get(f"/workflows/{flow}/proof", params={"cursor": "nonsense"})
    assert bad.status_code == 400 and "cursor" in bad.json()["message"]


def test_sub_workflows_share_their_roots_budget_of_jobs(db_url, monkeypatch):
    monkeypatch.setenv("QFORGE_MAX_WORKFLOW_JOBS", "8")
    for client in serve(db_url):
        stored = client.put("/definitions/child", json={"steps": [
            {"step": f"wait{n}", "type": "wait_for_trigger"} for n in range(3)]})
        assert stored.status_code in (200, 201), stored.text
        # 3 workflow steps + 3 children of 3 steps each = 12 jobs > 8: the first child fits (6), not the second
        flow = client.post("/workflows", json={"name": "tree", "steps": [
            {"step": f"c{n}", "type": "workflow", "definition": "child"} for n in range(3)]})
        assert flow.status_code == 201, flow.text
        steps = {s["step"]: s for s in client.get(f"/workflows/{flow.json()['id']}").json()["steps"]}
        assert steps["c0"]["status"] == "waiting", steps["c0"]
        refused = [s for s in steps.values() if s["status"] == "dead"]
        assert len(refused) == 2 and all("QFORGE_MAX_WORKFLOW_JOBS (8)" in s["error"] for s in refused), steps
        with psycopg.connect(db_url) as conn:
            assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 6  # the refused children left nothing
