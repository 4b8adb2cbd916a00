"""`qforge audit verify --archive DIR`: the chains and checkpoints span the archive segments and the live log."""

from __future__ import annotations

import gzip
import hashlib
import json
import re

from qforge.workflows import engine as wf
from qforge.log.archive import archive
from qforge.audit import checkpoints as audit
from test_archive import run_all, workload
from test_audit import run_cli, tamper
from test_audit_proof import check_alone


def archived_log(conn, scratch_dir):
    """A workload checkpointed, then its closed partitions archived (some streams go on in the live log)."""
    work = workload(conn)
    audit.checkpoint(conn)
    done = archive(conn, scratch_dir / "archive", close_current=False)
    assert done.segments, "the workload fills several partitions"
    live_lower = conn.execute("SELECT min(lower) AS lower FROM log_partitions()").fetchone()["lower"]
    assert live_lower > 1
    return work, scratch_dir / "archive", live_lower


def test_verify_reads_the_archive_and_the_live_log_as_one(conn, db_url, capsys, scratch_dir):
    work, directory, live_lower = archived_log(conn, scratch_dir)
    # The waiting workflow's first events are archived; its stream goes on in the live log.
    wf.trigger(conn, work.waiting_workflow, "approve", {"ok": True}, actor="test")
    run_all(conn)
    first_live = conn.execute("SELECT min(version) AS v FROM events WHERE stream_id = %s",
                              (work.waiting_workflow,)).fetchone()["v"]
    assert first_live > 1
    audit.checkpoint(conn)
    code, out = run_cli(capsys, db_url, "verify")
    assert code == 0 and f"events below position {live_lower} are archived and were not checked" in out, out
    code, out = run_cli(capsys, db_url, "verify", "--archive", str(directory))
    assert code == 0 and "archived)" in out and "not checked" not in out, out


def rewrite_segment(directory, edit) -> int:
    """An attacker's edit of one archived event, the file's checksum in its manifest recomputed."""
    manifest_path = sorted(directory.glob("events-*.manifest.json"))[0]
    manifest = json.loads(manifest_path.read_text())
    path = directory / manifest["file"]
    lines = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]
    position = edit(lines)
    path.write_bytes(gzip.compress(("\n".join(json.dumps(line) for line in lines) + "\n").encode()))
    manifest["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest_path.write_text(json.dumps(manifest))
    return position


def test_verify_names_an_archived_event_edited_and_rehashed_with_its_segment_s_checksum(
        conn, db_url, capsys, scratch_dir):
    _, directory, _ = archived_log(conn, scratch_dir)

    def edit(lines):
        line = next(line for line in lines if line["type"] == "Enqueued")
        line["data"] = line["data"].replace('"echo"', '"rm -rf"')
        line["hash"] = audit.event_hash(None, {**line, "data_text": line["data"], "tags_text": line["tags"]}).hex()
        return line["position"]

    position = rewrite_segment(directory, edit)
    code, out = run_cli(capsys, db_url, "verify", "--archive", str(directory))
    assert code == 1, out
    assert position in {int(p) for p in re.findall(r"^position=(\d+)", out, re.MULTILINE)}, out
    assert "checkpoint" in out


def test_verify_without_the_archive_still_checks_every_live_event(conn, db_url, capsys, scratch_dir):
    _, _, live_lower = archived_log(conn, scratch_dir)
    target = conn.execute("SELECT position FROM events WHERE position >= %s ORDER BY position LIMIT 1",
                          (live_lower,)).fetchone()["position"]
    tamper(conn, "DELETE FROM events WHERE position = %s", (target,))
    code, out = run_cli(capsys, db_url, "verify")
    assert code == 1 and f"position={target}" in out, out


def test_a_proof_of_a_stream_that_goes_on_from_the_archive_holds_alone(conn, db_url, capsys, scratch_dir,
                                                                         tmp_path):
    work, directory, _ = archived_log(conn, scratch_dir)
    wf.trigger(conn, work.waiting_workflow, "approve", {"ok": True}, actor="test")
    run_all(conn)
    audit.checkpoint(conn)
    head = tmp_path / "head.jsonl"
    head.write_text(run_cli(capsys, db_url, "head")[1])
    without = tmp_path / "without.json"
    without.write_text(run_cli(capsys, db_url, "export", str(work.waiting_workflow))[1])
    assert check_alone(without, head)[0] == 1  # starts where the live log does
    code, out = run_cli(capsys, db_url, "export", str(work.waiting_workflow), "--archive", str(directory))
    assert code == 0, out
    proof = tmp_path / "proof.json"
    proof.write_text(out)
    body = json.loads(out)
    own = [e for e in body["events"] if e["stream_id"] == str(work.waiting_workflow)]
    assert [e["version"] for e in own] == list(range(1, len(own) + 1))
    code, out = check_alone(proof, head)
    assert code == 0, out
