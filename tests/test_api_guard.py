"""The browser cannot ride on localhost (issue 30): a real `qforge api` refuses a foreign Host (400),
a write from a foreign Origin (403) and a write that is not JSON (415), before any token exists
(every caller an anonymous admin: the DNS-rebinding and cross-site text/plain attacks) and after."""

from __future__ import annotations

import json
from typing import Iterator

import httpx
import psycopg
import pytest

from cluster_procs import start_api
from qforge.api.guard import allowed_hosts, same_origin, split_authority
from qforge.commands import tokens
from test_worker_support import Processes, procs, tasks_dir  # noqa: F401 (fixtures)

JOB = {"task": "echo", "payload": {"hello": "world"}}


def events_written(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT count(*) FROM events WHERE stream_type <> 'token'").fetchone()[0]


@pytest.fixture
def api(procs: Processes) -> Iterator[tuple[str, int]]:  # noqa: F811
    _, base = start_api(procs)
    yield base, int(base.rsplit(":", 1)[1])


def test_a_foreign_host_a_foreign_origin_and_a_text_plain_write_are_refused(api, db_url):
    base, port = api
    with httpx.Client(base_url=base, timeout=30) as client:
        # DNS rebinding: the page's own name, pointed at 127.0.0.1, rides in Host.
        rebound = client.get("/jobs", headers={"Host": f"attacker.example:{port}"})
        assert rebound.status_code == 400, rebound.text
        assert rebound.json()["error"] == "host_not_allowed"
        assert "QFORGE_ALLOWED_HOSTS" in rebound.json()["message"]
        posted = client.post("/jobs", json=JOB, headers={"Host": "attacker.example"})
        assert posted.status_code == 400
        assert client.get("/", headers={"Host": "attacker.example"}).status_code == 400  # the dashboard too
        assert client.get("/healthz", headers={"Host": "10.1.2.3:8090"}).status_code == 200  # probes by pod IP
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", "[::1]"):
            assert client.get("/jobs", headers={"Host": host}).status_code == 200, host

        # A cross-site form or no-cors fetch: text/plain carrying JSON, from another origin.
        cross_site = client.post("/jobs", content=json.dumps(JOB),
                                 headers={"Content-Type": "text/plain", "Origin": "https://attacker.example"})
        assert cross_site.status_code == 403, cross_site.text
        assert cross_site.json()["error"] == "foreign_origin"
        for origin in ("null", f"http://127.0.0.1:{port + 1}", f"http://attacker.example:{port}"):
            refused = client.post("/jobs", json=JOB, headers={"Origin": origin})
            assert refused.status_code == 403, (origin, refused.text)
        # Even without an Origin (an old browser, a proxy that drops it) text/plain is no JSON body.
        plain = client.post("/jobs", content=json.dumps(JOB), headers={"Content-Type": "text/plain"})
        assert plain.status_code == 415, plain.text
        assert plain.json()["error"] == "unsupported_media_type"
        assert "application/json" in plain.json()["message"]
        form = client.post("/jobs", data={"task": "echo"})  # application/x-www-form-urlencoded
        assert form.status_code == 415
        untyped = client.post("/jobs", content=json.dumps(JOB), headers={"Content-Type": ""})
        assert untyped.status_code == 415
        assert events_written(db_url) == 0  # nothing of it reached the log

        # What the dashboard and the client do still works: same origin, JSON, body-less commands.
        same = client.post("/jobs", json=JOB, headers={"Origin": f"http://127.0.0.1:{port}"})
        assert same.status_code == 201, same.text
        job_id = same.json()["id"]
        charset = client.post("/jobs", content=json.dumps(JOB).encode(),
                              headers={"Content-Type": "application/json; charset=utf-8"})
        assert charset.status_code == 201
        bare = client.post(f"/jobs/{job_id}/cancel")  # curl -X POST: no body, no type
        assert bare.status_code == 200, bare.text
        assert client.post("/events/stream-ticket",
                           headers={"Origin": f"http://localhost:{port}", "Host": f"localhost:{port}"}
                           ).status_code == 200

        # With a token (authentication on) the checks come first, the same way.
        with psycopg.connect(db_url, autocommit=True) as conn:
            secret = tokens.create_token(conn, "admin", "admin", actor="test")
        auth = {"Authorization": f"Bearer {secret}"}
        assert client.get("/jobs", headers={**auth, "Host": "attacker.example"}).status_code == 400
        assert client.post("/jobs", json=JOB, headers={**auth, "Origin": "https://attacker.example"}
                           ).status_code == 403
        assert client.post("/jobs", content=json.dumps(JOB), headers={**auth, "Content-Type": "text/plain"}
                           ).status_code == 415
        assert client.post("/jobs", json=JOB).status_code == 401
        assert client.post("/jobs", json=JOB, headers=auth).status_code == 201


def test_allowed_hosts_setting(procs: Processes):  # noqa: F811
    _, base = start_api(procs, env={"QFORGE_ALLOWED_HOSTS": "qforge.internal,.example.org"})
    with httpx.Client(base_url=base, timeout=30) as client:
        assert client.get("/jobs", headers={"Host": "qforge.internal"}).status_code == 200
        assert client.get("/jobs", headers={"Host": "api.example.org:443"}).status_code == 200
        assert client.get("/jobs", headers={"Host": "example.org"}).status_code == 200
        assert client.get("/jobs", headers={"Host": "notexample.org"}).status_code == 400
        # the list replaces the defaults
        refused = client.get("/jobs")
        assert refused.status_code == 400 and "qforge.internal" in refused.json()["message"]
        assert client.post("/jobs", json=JOB, headers={
            "Host": "api.example.org", "Origin": "https://api.example.org"}).status_code == 201


def test_origin_and_host_parsing():
    assert split_authority("[::1]:8090") == ("[::1]", "8090")
    assert split_authority("Example.COM") == ("example.com", None)
    assert same_origin("https://example.com", "example.com:443")
    assert same_origin("http://127.0.0.1:8090", "127.0.0.1:8090")
    assert not same_origin("http://127.0.0.1:8091", "127.0.0.1:8090")
    assert not same_origin("null", "127.0.0.1:8090")
    assert not same_origin("http://user@127.0.0.1:8090", "127.0.0.1:8090")
    assert allowed_hosts("", "::1") == frozenset({"localhost", "127.0.0.1", "[::1]"})
    assert "0.0.0.0" in allowed_hosts("", "0.0.0.0")
