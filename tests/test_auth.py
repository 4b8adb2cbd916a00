"""Named tokens and scopes on every route, the actor of every event, stream tickets, the docs and the headers."""

from __future__ import annotations

import base64
import threading
import time
import uuid
from typing import Iterator

import httpx
import psycopg
import pytest

from qforge.api import auth
from qforge.api.routes import events as events_route
from qforge.api.app import create_app
from qforge.api.server import BackgroundServer
from qforge.commands import tokens
from qforge.settings import Settings

NO_ID = str(uuid.UUID(int=1))

# Every route of the API and the scope it needs. A route added to the app and
# not here fails test_the_table_lists_every_route: decide its scope, add it.
ROUTES: list[tuple[str, str, str]] = [
    ("GET", "/jobs", "read"), ("GET", f"/jobs/{NO_ID}", "read"), ("GET", f"/jobs/{NO_ID}/events", "read"),
    ("GET", f"/jobs/{NO_ID}/proof", "read"), ("GET", f"/workflows/{NO_ID}/proof", "read"),
    ("POST", "/jobs", "operate"), ("POST", f"/jobs/{NO_ID}/cancel", "operate"),
    ("POST", f"/jobs/{NO_ID}/retry", "operate"),
    ("POST", "/jobs/cancel", "operate"), ("POST", "/jobs/retry", "operate"),
    ("GET", "/workflows", "read"), ("GET", f"/workflows/{NO_ID}", "read"),
    ("GET", f"/workflows/{NO_ID}/events", "read"), ("POST", "/workflows", "operate"),
    ("POST", f"/workflows/{NO_ID}/cancel", "operate"),
    ("POST", f"/workflows/{NO_ID}/steps/s/trigger", "operate"),
    ("POST", "/workflow", "operate"), ("GET", "/workflow/nope", "read"), ("GET", "/pods", "read"),
    ("GET", "/events", "read"), ("GET", "/events/stream", "read"), ("POST", "/events/stream-ticket", "read"),
    ("GET", "/executions", "read"), ("GET", "/queues", "read"), ("GET", "/workers", "read"),
    ("GET", "/metrics", "read"), ("GET", "/docs", "read"), ("GET", "/openapi.json", "read"),
    ("GET", "/tokens", "admin"), ("POST", "/tokens", "admin"), ("DELETE", "/tokens/nobody", "admin"),
    ("PUT", "/queues/nobody", "admin"), ("GET", "/stats/recent", "read"),
    ("POST", f"/workflows/{NO_ID}/resume", "operate"),
    ("GET", "/definitions", "read"), ("GET", "/definitions/nobody", "read"), ("PUT", "/definitions/nobody", "admin"),
    ("POST", "/definitions/nobody/runs", "operate"),
    ("GET", "/schedules", "read"), ("GET", "/schedules/nobody", "read"), ("GET", "/schedules/nobody/events", "read"),
    ("POST", "/schedules", "admin"), ("PATCH", "/schedules/nobody", "admin"), ("DELETE", "/schedules/nobody", "admin"),
    ("GET", "/keys", "read"), ("GET", "/keys/nobody", "read"), ("GET", "/keys/nobody/events", "read"),
    ("PUT", "/keys/nobody", "admin"),
]
PUBLIC = [("GET", "/healthz"), ("GET", "/js/states.js"), ("GET", "/favicon.ico")]
SCOPES = ("read", "operate", "admin")


def serve(db_url: str, **settings) -> Iterator[httpx.Client]:
    app = create_app(db_url, settings=Settings(database_url=db_url, **{"api_token": None, **settings}))
    with BackgroundServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


@pytest.fixture
def api(db_url: str) -> Iterator[httpx.Client]:
    yield from serve(db_url)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def template(path: str) -> str:
    return (path.replace(NO_ID, "{job_id}") if path.startswith("/jobs/") else
            path.replace(NO_ID, "{workflow_id}").replace("/s/", "/{step}/")
            .replace("/workflow/nope", "/workflow/{workflowId}").replace("/nobody", "/{name}"))


def call(client: httpx.Client, method: str, path: str, headers: dict | None = None) -> int:
    """The status of one request (a stream is opened and closed at once)."""
    if path == "/events/stream":
        with client.stream(method, path, headers=headers) as response:
            return response.status_code
    kwargs = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
    return client.request(method, path, headers=headers, **kwargs).status_code


def test_the_table_lists_every_route() -> None:
    app = create_app("postgresql://unused@/unused", settings=Settings(api_token=None))
    served = {(method, route.path) for route in auth.api_routes(app) for method in route.methods}
    listed = {(method, template(path)) for method, path, _ in ROUTES} | set(PUBLIC)
    assert served == listed


def test_every_route_answers_each_scope_as_the_table_says(db_url: str, conn: psycopg.Connection,
                                                          api: httpx.Client) -> None:
    secrets = {scope: tokens.create_token(conn, f"t-{scope}", scope, actor="test") for scope in SCOPES}
    for method, path, needed in ROUTES:
        assert call(api, method, path) == 401, (method, path)
        assert call(api, method, path, bearer("qf_wrong")) == 401, (method, path)
        for scope in SCOPES:
            status = call(api, method, path, bearer(secrets[scope]))
            allowed = SCOPES.index(scope) >= SCOPES.index(needed)
            assert (status not in (401, 403)) if allowed else status == 403, (method, path, scope, status)
    for method, path in PUBLIC:
        assert call(api, method, path) in (200, 204), path


def test_a_403_names_the_scope_needed(conn: psycopg.Connection, api: httpx.Client) -> None:
    secret = tokens.create_token(conn, "viewer", "read", actor="test")
    body = api.post("/jobs", json={"task": "echo"}, headers=bearer(secret)).json()
    assert body["error"] == "forbidden" and "'operate'" in body["message"]
    assert body["details"][0]["needed_scope"] == "operate"
    assert conn.execute("SELECT count(*) AS n FROM jobs").fetchone()["n"] == 0


def test_without_tokens_everyone_is_anonymous_and_the_log_says_so(conn: psycopg.Connection,
                                                                   api: httpx.Client) -> None:
    job = api.post("/jobs", json={"task": "echo"}).json()
    api.post(f"/jobs/{job['id']}/cancel").raise_for_status()
    actors = [e["actor"] for e in api.get(f"/jobs/{job['id']}/events").json()["events"]]
    assert actors == ["anonymous", "anonymous"]


def test_every_event_a_request_writes_carries_the_tokens_name(conn: psycopg.Connection,
                                                              api: httpx.Client) -> None:
    alice = bearer(tokens.create_token(conn, "alice", "operate", actor="test"))
    bob = bearer(tokens.create_token(conn, "bob", "operate", actor="test"))
    job = api.post("/jobs", json={"task": "echo", "tags": {"team": "a"}}, headers=alice).json()
    api.post(f"/jobs/{job['id']}/cancel", headers=bob).raise_for_status()
    api.post(f"/jobs/{job['id']}/retry", headers=alice).raise_for_status()
    history = api.get(f"/jobs/{job['id']}/events", headers=bob).json()["events"]
    assert [(e["type"], e["actor"]) for e in history] == [
        ("Enqueued", "alice"), ("Cancelled", "bob"), ("Retried", "alice")]
    flow = api.post("/workflows", headers=bob, json={"name": "w", "tags": {"team": "a"}, "steps": [
        {"step": "gate", "type": "wait_for_trigger"}]}).json()
    api.post(f"/workflows/{flow['id']}/steps/gate/trigger", headers=alice).raise_for_status()
    by_type = {e["type"]: e["actor"] for e in api.get(f"/workflows/{flow['id']}/events", headers=bob).json()["events"]}
    assert by_type["WorkflowSubmitted"] == "bob" and by_type["Triggered"] == "alice"
    compat = api.post("/workflow", headers=alice, json={"workflowId": "c1", "steps": [
        {"id": "a", "command": "true"}]})
    assert compat.status_code == 201
    assert {r["actor"] for r in conn.execute(
        "SELECT actor FROM events WHERE stream_type <> 'token'").fetchall()} == {"alice", "bob"}

    def found(actor: str) -> set[str]:
        page = api.get("/executions", params={"tag": "team:a", "actor": actor}, headers=bob).json()
        return {item["id"] for item in page["items"]}

    gate = next(step["job_id"] for step in flow["steps"])
    assert found("alice") == {job["id"], flow["id"], gate}  # the workflow through its step's trigger
    assert found("bob") == {job["id"], flow["id"], gate}
    assert found("carol") == set()


def test_a_revocation_holds_at_once_on_every_api_process(db_url: str, conn: psycopg.Connection) -> None:
    secret = tokens.create_token(conn, "ci", "read", actor="test")
    other = tokens.create_token(conn, "keeper", "admin", actor="test")
    for first in serve(db_url):
        for second in serve(db_url):
            assert first.get("/jobs", headers=bearer(secret)).status_code == 200
            assert second.get("/jobs", headers=bearer(secret)).status_code == 200
            assert first.delete("/tokens/ci", headers=bearer(other)).status_code == 204
            assert second.get("/jobs", headers=bearer(secret)).status_code == 401
            assert first.get("/jobs", headers=bearer(secret)).status_code == 401
            assert second.delete("/tokens/ci", headers=bearer(other)).status_code == 409
    revoked = conn.execute("SELECT actor FROM events WHERE type = 'TokenRevoked'").fetchone()
    assert revoked["actor"] == "keeper"


def test_revoking_the_last_token_locks_the_api(conn: psycopg.Connection, api: httpx.Client) -> None:
    tokens.create_token(conn, "only", "admin", actor="test")
    tokens.revoke_token(conn, "only", actor="test")
    assert api.get("/jobs").status_code == 401


def test_tokens_over_http_for_admins(conn: psycopg.Connection, api: httpx.Client) -> None:
    admin = bearer(tokens.create_token(conn, "root", "admin", actor="test"))
    made = api.post("/tokens", json={"name": "reader", "scope": "read"}, headers=admin)
    assert made.status_code == 201
    assert api.get("/jobs", headers=bearer(made.json()["token"])).status_code == 200
    listed = api.get("/tokens", headers=admin).json()["items"]
    assert [(t["name"], t["scope"], t["created_by"]) for t in listed] == [
        ("reader", "read", "root"), ("root", "admin", "test")]
    assert "token" not in listed[0] and "sha256" not in listed[0]
    assert api.post("/tokens", json={"name": "Bad Name", "scope": "read"}, headers=admin).status_code == 422
    assert api.post("/tokens", json={"name": "reader", "scope": "read"}, headers=admin).status_code == 409


def test_the_api_token_setting_is_one_admin_token(db_url: str) -> None:
    for client in serve(db_url, api_token="s3cret"):
        assert client.get("/jobs").status_code == 401
        job = client.post("/jobs", json={"task": "echo"}, headers=bearer("s3cret")).json()
        events = client.get(f"/jobs/{job['id']}/events", headers=bearer("s3cret")).json()["events"]
        assert events[0]["actor"] == "api-token"


# --------------------------------------------------------------------------- stream tickets


def ticket_for(api: httpx.Client, secret: str) -> str:
    response = api.post("/events/stream-ticket", headers=bearer(secret))
    assert response.status_code == 200, response.text
    assert response.json()["expires_in"] == 60
    return response.json()["ticket"]


def stream_status(api: httpx.Client, **params) -> int:
    with api.stream("GET", "/events/stream", params=params) as response:
        return response.status_code


def test_a_ticket_opens_the_stream_and_nothing_else(conn: psycopg.Connection, api: httpx.Client) -> None:
    secret = tokens.create_token(conn, "viewer", "read", actor="test")
    ticket = ticket_for(api, secret)
    assert stream_status(api, ticket=ticket, after="0") == 200
    assert api.get("/jobs", headers=bearer(ticket)).status_code == 401
    assert api.get("/jobs", params={"ticket": ticket}).status_code == 401
    assert stream_status(api, ticket=ticket[:-2] + ("AA" if not ticket.endswith("AA") else "BB")) == 401
    payload, _, signature = ticket.partition(".")
    forged = base64.urlsafe_b64encode(
        base64.urlsafe_b64decode(payload + "==").replace(b'"viewer"', b'"rooter"')).rstrip(b"=").decode()
    assert stream_status(api, ticket=f"{forged}.{signature}") == 401
    assert stream_status(api, ticket="garbage") == 401
    tokens.revoke_token(conn, "viewer", actor="test")
    assert stream_status(api, ticket=ticket) == 401


def test_a_ticket_expires(db_url: str, conn: psycopg.Connection) -> None:
    secret = tokens.create_token(conn, "viewer", "read", actor="test")
    for client in serve(db_url, stream_ticket_seconds=1):
        ticket = client.post("/events/stream-ticket", headers=bearer(secret)).json()["ticket"]
        assert stream_status(client, ticket=ticket) == 200
        deadline = time.monotonic() + 10
        while stream_status(client, ticket=ticket) == 200:
            assert time.monotonic() < deadline, "the ticket never expired"
            time.sleep(0.2)
        body = client.get("/events/stream", params={"ticket": ticket}).json()
        assert "expired" in body["message"]


def test_the_token_in_the_stream_url_only_when_enabled(db_url: str, conn: psycopg.Connection) -> None:
    secret = tokens.create_token(conn, "viewer", "read", actor="test")
    for client in serve(db_url):
        assert stream_status(client, token=secret) == 401
    for client in serve(db_url, stream_query_token=True):
        assert stream_status(client, token=secret) == 200


def test_an_open_stream_ends_once_its_token_is_revoked(db_url: str, conn: psycopg.Connection,
                                                       monkeypatch) -> None:
    monkeypatch.setattr(auth, "STREAM_RECHECK_SECONDS", 0.3)
    monkeypatch.setattr(events_route, "IDLE_RECHECK_SECONDS", 0.2)
    secret = tokens.create_token(conn, "viewer", "read", actor="test")
    ended = threading.Event()
    for client in serve(db_url):
        ticket = ticket_for(client, secret)

        def read() -> None:
            with client.stream("GET", "/events/stream", params={"ticket": ticket}) as response:
                for _ in response.iter_bytes():
                    pass
            ended.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert not ended.wait(1.0), "the stream ended while its token was valid"
        tokens.revoke_token(conn, "viewer", actor="test")
        assert ended.wait(10), "the stream went on after its token was revoked"


# --------------------------------------------------------------------------- docs and headers


def test_docs_and_openapi_need_a_read_token_by_basic_auth_too(conn: psycopg.Connection, api: httpx.Client) -> None:
    assert api.get("/openapi.json").status_code == 200  # no token yet: anonymous
    secret = tokens.create_token(conn, "viewer", "read", actor="test")
    refused = api.get("/docs")
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
    assert api.get("/openapi.json").status_code == 401
    assert api.get("/docs", auth=("anyone", secret)).status_code == 200
    schema = api.get("/openapi.json", auth=("anyone", secret)).json()
    assert schema["paths"]["/jobs"]["post"]["x-qforge-scope"] == "operate"
    assert api.get("/jobs", auth=("anyone", secret)).status_code == 401  # Basic only for the docs


def test_every_response_carries_the_security_headers(api: httpx.Client) -> None:
    for path in ("/", "/healthz", "/jobs", "/js/states.js", f"/jobs/{NO_ID}"):
        headers = api.get(path).headers
        assert "script-src 'self'" in headers["content-security-policy"], path
        assert "frame-ancestors 'none'" in headers["content-security-policy"], path
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["x-frame-options"] == "DENY"
        assert headers["referrer-policy"] == "no-referrer"
        assert headers["cross-origin-opener-policy"] == "same-origin"


def test_an_unguarded_route_is_refused_at_startup() -> None:
    app = create_app("postgresql://unused@/unused", settings=Settings(api_token=None))

    @app.get("/leak")
    def leak() -> dict:
        return {}

    with pytest.raises(RuntimeError, match="/leak"):
        auth.refuse_unguarded(app)
