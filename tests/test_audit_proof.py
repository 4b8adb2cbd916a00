"""Proofs: an execution's events, their Merkle paths and the checkpoint chain, checked alone by tools/verify_audit_proof.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from qforge.api.app import create_app
from qforge.api.server import BackgroundServer
from qforge.audit import checkpoints as audit
from tests.factories import make_job
from tests.test_audit import run_cli, tamper, workload

TOOL = Path(__file__).resolve().parent.parent / "tools" / "verify_audit_proof.py"


def check_alone(proof: Path, head: Path, *extra: str) -> tuple[int, str]:
    """The auditor's run: the system's python, isolated (-I: no site-packages, no QForge on the path)."""
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    done = subprocess.run([python, "-I", str(TOOL), str(proof), str(head), *extra], capture_output=True,
                          text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
def exported(conn, db_url, capsys, tmp_path):
    ids = workload(conn)
    audit.checkpoint(conn)
    head = tmp_path / "head.jsonl"
    head.write_text(run_cli(capsys, db_url, "head")[1])

    def export(execution_id, name: str = "proof.json") -> Path:
        code, out = run_cli(capsys, db_url, "export", str(execution_id))
        assert code == 0, out
        path = tmp_path / name
        path.write_text(out)
        return path

    return {**ids, "head": head, "export": export}


def test_a_job_proof_holds_alone_against_the_head(exported):
    proof = exported["export"](exported["order"])
    body = json.loads(proof.read_text())
    assert body["kind"] == "job" and {e["stream_id"] for e in body["events"]} == {str(exported["order"])}
    assert all(e["checkpoint"] == 1 and e["merkle_path"] is not None for e in body["events"])
    code, out = check_alone(proof, exported["head"])
    assert code == 0 and "the proof holds" in out and "verified up to checkpoint 1" in out, out


def test_a_workflow_proof_holds_its_own_stream_and_its_steps_whole_streams(exported):
    proof = exported["export"](exported["workflow"])
    body = json.loads(proof.read_text())
    kinds = {e["stream_type"] for e in body["events"]}
    assert body["kind"] == "workflow" and kinds == {"workflow", "job"}
    assert all(e["version"] >= 1 for e in body["events"])
    assert check_alone(proof, exported["head"])[0] == 0


def test_an_edited_proof_does_not_hold(exported):
    proof = exported["export"](exported["order"])
    body = json.loads(proof.read_text())
    first = body["events"][0]
    first["data_text"] = first["data_text"].replace("12.5", "1250")
    proof.write_text(json.dumps(body))
    code, out = check_alone(proof, exported["head"])
    assert code == 1 and f"position={first['position']}" in out, out
    # Rehashing the edited event (and chaining the rest) does not help: the checkpoint's leaves do not move.
    prev = None
    for event in body["events"]:
        event["hash"] = audit.event_hash(prev, event).hex()
        prev = bytes.fromhex(event["hash"])
    proof.write_text(json.dumps(body))
    code, out = check_alone(proof, exported["head"])
    assert code == 1 and f"position={first['position']} stream={exported['order']}: not a leaf" in out, out


def test_a_proof_of_a_log_changed_after_its_checkpoint_does_not_hold(conn, exported):
    target = conn.execute("SELECT position FROM events WHERE stream_id = %s AND version = 1",
                          (exported["order"],)).fetchone()["position"]
    tamper(conn, "UPDATE events SET data = data || '{\"forged\": true}',"
                 " hash = event_hash(NULL, stream_type, stream_id, version, type, schema_version,"
                 "                   data || '{\"forged\": true}', tags, workflow_id, occurred_at, actor)"
                 " WHERE position = %s", (target,))
    code, out = check_alone(exported["export"](exported["order"]), exported["head"])
    assert code == 1 and f"position={target}" in out, out


def test_a_proof_needs_a_head_that_covers_its_events(conn, db_url, capsys, exported, tmp_path):
    late = make_job(conn)
    proof = exported["export"](late, "late.json")
    code, out = check_alone(proof, exported["head"])
    assert code == 1 and "no checkpoint up to the head covers this event yet" in out, out
    audit.checkpoint(conn)
    proof = exported["export"](late, "late.json")
    assert check_alone(proof, exported["head"])[0] == 1  # the old head does not reach checkpoint 2
    newer = tmp_path / "newer.jsonl"
    newer.write_text(run_cli(capsys, db_url, "head")[1])
    assert check_alone(proof, newer)[0] == 0
    # An older head still vouches for what it covered, through the chain of checkpoints.
    assert check_alone(exported["export"](exported["order"]), exported["head"])[0] == 0


def test_a_signed_head_is_checked_with_the_public_key_alone(conn, db_url, capsys, exported, monkeypatch, tmp_path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    monkeypatch.setenv("QFORGE_AUDIT_SIGNING_KEY", key.private_bytes_raw().hex())
    signed = tmp_path / "signed.jsonl"
    signed.write_text(run_cli(capsys, db_url, "head")[1])
    proof = exported["export"](exported["order"])
    assert check_alone(proof, signed, "--public-key", audit.public_key_hex(key))[0] == 0
    stranger = audit.public_key_hex(Ed25519PrivateKey.generate())
    code, out = check_alone(proof, signed, "--public-key", stranger)
    assert code == 1 and "signature does not hold" in out, out


def test_proof_routes_answer_with_the_proof_and_the_server_s_check(conn, db_url, exported):
    with BackgroundServer(create_app(db_url)) as server, httpx.Client(base_url=server.url, timeout=30) as api:
        job = api.get(f"/jobs/{exported['order']}/proof")
        assert job.status_code == 200, job.text
        assert job.json()["status"] == {"verified": True, "checkpoint": 1, "covered": len(job.json()["events"]),
                                        "events": len(job.json()["events"]), "problems": []}
        workflow = api.get(f"/workflows/{exported['workflow']}/proof")
        assert workflow.status_code == 200 and workflow.json()["status"]["verified"] is True
        assert api.get(f"/workflows/{exported['order']}/proof").status_code == 404
        assert api.get(f"/jobs/{exported['workflow']}/proof").status_code == 404
        assert api.get("/jobs/00000000-0000-0000-0000-000000000000/proof").status_code == 404

        target = job.json()["events"][0]["position"]
        tamper(conn, "UPDATE events SET data = '{}' WHERE position = %s", (target,))
        status = api.get(f"/jobs/{exported['order']}/proof").json()["status"]
        assert status["verified"] is False and any(f"position={target}" in p for p in status["problems"])

        make_job(conn)
        fresh = api.get(f"/jobs/{exported['other']}/proof").json()["status"]
        assert fresh["verified"] is True
