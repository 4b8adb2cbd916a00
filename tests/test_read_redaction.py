"""Read means read (issue 30): a read token sees secret-looking fields as *** everywhere a payload
shows (jobs, lists, searches, histories, /events, the SSE stream, workflows, proofs), operate and
admin see them whole, and a redacted proof still verifies alone, its masked events listed as withheld."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import psycopg
import pytest

from qforge.api.app import create_app
from qforge.api.server import BackgroundServer
from qforge.commands import tokens
from qforge.audit import checkpoints as audit
from qforge.settings import Settings

TOOL = Path(__file__).resolve().parents[1] / "tools" / "verify_audit_proof.py"
SECRETS = ("Bearer s3cret-bearer", "session=s3cret-cookie", "s3cret-env", "s3cret-key")
PAYLOAD = {"url": "http://127.0.0.1:9/hook", "method": "POST",
           "headers": {"Authorization": "Bearer s3cret-bearer", "Cookie": "session=s3cret-cookie",
                       "Accept": "application/json"},
           "env": {"TOKEN": "s3cret-env"}, "nested": [{"API_Key": "s3cret-key"}], "plain": "visible"}


@pytest.fixture
def served(db_url: str) -> Iterator[tuple[httpx.Client, dict, dict]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        admin = tokens.create_token(conn, "boss", "admin", actor="test")
        reader = tokens.create_token(conn, "watcher", "read", actor="test")
    settings = Settings(database_url=db_url, api_token=None, redact_fields="api_key")
    with BackgroundServer(create_app(db_url, settings=settings)) as server, \
            httpx.Client(base_url=server.url, timeout=30) as client:
        yield client, {"Authorization": f"Bearer {admin}"}, {"Authorization": f"Bearer {reader}"}


def leaked(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def test_a_read_token_sees_secret_looking_fields_masked_everywhere(served, db_url, conn, tmp_path):
    client, admin, reader = served
    job = client.post("/jobs", json={"task": "echo", "payload": PAYLOAD, "tags": {"team": "ops"}}, headers=admin)
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    flow = client.post("/workflows", json={"name": "hooks", "tags": {"team": "ops"}, "steps": [
        {"step": "call", "task": "http", "payload": PAYLOAD}]}, headers=admin)
    assert flow.status_code == 201, flow.text
    flow_id = flow.json()["id"]

    reads = [f"/jobs/{job_id}", "/jobs", f"/jobs/{job_id}/events", "/events?after=0", "/executions?tag=team:ops",
             f"/workflows/{flow_id}/events"]
    for path in (f"/workflows/{flow_id}", "/workflows"):  # no payloads there, so nothing to hide
        assert client.get(path, headers=reader).status_code == 200 and not leaked(client.get(path, headers=reader).text)
    for path in reads:
        as_admin = client.get(path, headers=admin)
        as_reader = client.get(path, headers=reader)
        assert as_admin.status_code == as_reader.status_code == 200, (path, as_reader.text)
        assert leaked(as_admin.text), path  # the stored values are there, for operate and admin
        assert not leaked(as_reader.text), (path, leaked(as_reader.text))
        assert "visible" in as_reader.text and "***" in as_reader.text, path
        assert int(as_reader.headers["content-length"]) == len(as_reader.content)

    seen = client.get(f"/jobs/{job_id}", headers=reader).json()["payload"]
    assert seen["headers"] == {"Authorization": "***", "Cookie": "***", "Accept": "application/json"}
    assert seen["env"] == {"TOKEN": "***"} and seen["nested"] == [{"API_Key": "***"}]

    # The stream, with a bearer token and with a ticket of the read token.
    ticket = client.post("/events/stream-ticket", headers=reader).json()["ticket"]
    for params, headers in (({"after": "0"}, reader), ({"after": "0", "ticket": ticket}, {})):
        text = ""
        with client.stream("GET", "/events/stream", params=params, headers=headers) as stream:
            deadline = time.monotonic() + 20
            for chunk in stream.iter_text():
                text += chunk
                if text.count("event: Enqueued") >= 2 or time.monotonic() > deadline:
                    break
        assert text.count("event: Enqueued") >= 2, text[:500]
        assert not leaked(text) and "***" in text
        for line in text.splitlines():
            if line.startswith("data: "):
                json.loads(line[6:])  # still one JSON document per data line
    admin_ticket = client.post("/events/stream-ticket", headers=admin).json()["ticket"]
    with client.stream("GET", "/events/stream", params={"after": "0", "ticket": admin_ticket}) as stream:
        text = ""
        for chunk in stream.iter_text():
            text += chunk
            if "s3cret-bearer" in text or len(text) > 100_000:
                break
    assert "s3cret-bearer" in text  # an admin's ticket streams the stored values

    # Proofs: the masked events keep their hash and place; the tool checks the rest and says so.
    audit.checkpoint(conn)
    head = tmp_path / "head.jsonl"
    head.write_text(json.dumps(audit.head(conn), default=str) + "\n")
    for path in (f"/jobs/{job_id}/proof", f"/workflows/{flow_id}/proof"):
        proof = client.get(path, headers=reader)
        assert proof.status_code == 200 and not leaked(proof.text), path
        body = proof.json()
        assert body["status"]["verified"], body["status"]
        redacted = [e for e in body["events"] if e.get("redacted")]
        assert redacted and all("***" in e["data_text"] for e in redacted)
        (tmp_path / "proof.json").write_text(proof.text)
        done = subprocess.run([sys.executable, "-I", str(TOOL), str(tmp_path / "proof.json"), str(head)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"withheld: position={redacted[0]['position']}" in done.stdout
        whole = client.get(path, headers=admin).json()
        assert not any(e.get("redacted") for e in whole["events"]) and leaked(json.dumps(whole))
        # a redacted event claimed unredacted no longer verifies: the mask is not the hashed bytes
        tampered = {**body, "events": [{k: v for k, v in e.items() if k != "redacted"} for e in body["events"]]}
        (tmp_path / "tampered.json").write_text(json.dumps(tampered))
        again = subprocess.run([sys.executable, "-I", str(TOOL), str(tmp_path / "tampered.json"), str(head)],
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 1, again.stdout
