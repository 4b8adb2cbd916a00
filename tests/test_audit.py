"""The tamper-evident log: checkpoints, heads, `qforge audit verify` against an attacker with triggers off."""

from __future__ import annotations

import json
import re

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from psycopg.rows import dict_row

from qforge import cli
from qforge.workflows import engine as wf
from qforge.commands.claim import claim
from qforge.commands.report import Report, complete
from qforge.db import connect
from qforge.audit import checkpoints as audit
from qforge.settings import Settings
from qforge.tools import verify_audit_proof as tool
from qforge.workers.monitor import Monitor
from tests.factories import count, make_job


def workload(conn) -> dict:
    """Jobs in several states and a workflow with a finished step: streams of one to a few events."""
    order = make_job(conn, payload={"order": "A-1001", "amount": 12.5}, tags={"order": "A-1001"})
    other = make_job(conn, payload={"note": "naïve ✓"})
    make_job(conn, queue="emails")
    spec = wf.WorkflowSpec.model_validate({"name": "ship", "steps": [
        {"step": "pack", "task": "echo"}, {"step": "send", "task": "echo", "depends_on": ["pack"]}]})
    workflow_id = wf.submit(conn, spec)[0]
    for job in claim(conn, ["default"], 10, "w1"):
        complete(conn, [Report(job.id, job.attempt, result={"ok": True})], actor="w1")
    return {"order": order, "other": other, "workflow": workflow_id}


def run_cli(capsys, db_url: str, *args: str) -> tuple[int, str]:
    code = cli.main(["--database-url", db_url, "audit", *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def tamper(conn, statement: str, params: dict | tuple = ()) -> None:
    """What a superuser can do: the log's triggers (append-only, the fold) switched off."""
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(statement, params)


def rechain(conn, job_id) -> None:
    """Recompute every hash of a job's stream from its (edited) events, and point its row at the new
    chain: a rewrite that every chain check finds consistent."""
    tamper(conn, """
        WITH rechained AS (
            SELECT position, event_chain(NULL::bytea, event_canonical_v1(stream_type, stream_id, version, type,
                       schema_version, data, tags, workflow_id, occurred_at, actor))
                       OVER (ORDER BY version) AS hash
              FROM events WHERE stream_id = %(id)s)
        UPDATE events e SET hash = r.hash FROM rechained r WHERE e.position = r.position""", {"id": job_id})
    tamper(conn, "UPDATE jobs SET chain = (SELECT hash FROM events WHERE stream_id = %(id)s"
                 " ORDER BY version DESC LIMIT 1) WHERE id = %(id)s", {"id": job_id})


def events_of(conn, stream_id) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM events WHERE stream_id = %s ORDER BY version", (stream_id,)).fetchall()


def positions_named(output: str) -> set[int]:
    return {int(p) for p in re.findall(r"^position=(\d+)", output, re.MULTILINE)}


# -- checkpoints and heads ------------------------------------------------------


def test_checkpoints_cover_each_event_once_and_chain(conn):
    workload(conn)
    first = audit.checkpoint(conn)
    assert [c.seq for c in first] == [1] and first[0].prev is None
    assert first[0].events == count(conn, "SELECT count(*) FROM events")
    assert audit.checkpoint(conn) == []  # nothing new, no empty checkpoint
    make_job(conn)
    make_job(conn)
    (second,) = audit.checkpoint(conn)
    assert (second.seq, second.events, second.prev) == (2, 2, first[0].hash)
    assert second.recomputed_hash() == second.hash
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute("SELECT positions FROM audit_checkpoints ORDER BY seq").fetchall()
    covered = [p for row in rows for p in row["positions"]]
    assert sorted(covered) == [r["position"] for r in conn.execute("SELECT position FROM events ORDER BY 1")]


def test_a_large_backlog_becomes_several_bounded_checkpoints(conn):
    for _ in range(7):
        make_job(conn)
    assert [c.seq for c in audit.checkpoint(conn, max_events=3, max_checkpoints=1)] == [1]
    made = audit.checkpoint(conn, max_events=3)
    assert [(c.seq, c.events) for c in made] == [(2, 3), (3, 1)]


def test_checkpoints_are_append_only_even_for_a_superuser(conn):
    make_job(conn)
    audit.checkpoint(conn)
    for statement in ("UPDATE audit_checkpoints SET events = 2", "DELETE FROM audit_checkpoints",
                      "TRUNCATE audit_checkpoints"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="audit_checkpoints is append-only"):
            conn.execute(statement)


def test_a_checkpoint_waits_for_transactions_that_may_still_commit_below_it(conn, db_url):
    with connect(db_url, autocommit=True) as slow:
        slow.execute("BEGIN")
        slow.execute("SELECT pg_current_xact_id()")  # its xid is older than the next commit's
        make_job(conn)
        assert audit.checkpoint(conn) == []  # a gapless reader cannot see past the open transaction yet
        slow.execute("SELECT 1 FROM events LIMIT 0")
        slow.execute("COMMIT")
    (made,) = audit.checkpoint(conn)
    assert made.events == 1


def test_the_monitor_leader_checkpoints_every_interval(conn, db_url):
    make_job(conn)
    monitor = Monitor(db_url, name="m", settings=Settings(audit_checkpoint_seconds=3600))
    with connect(db_url, autocommit=True) as own:
        monitor.tick(own)
        make_job(conn)
        monitor.tick(own)  # within the interval: no second checkpoint
    assert count(conn, "SELECT count(*) FROM audit_checkpoints") == 1
    off = Monitor(db_url, name="off", settings=Settings(audit_checkpoint_seconds=0))
    with connect(db_url, autocommit=True) as own:
        off.tick(own)
    assert count(conn, "SELECT count(*) FROM audit_checkpoints") == 1


def test_head_is_one_json_line_signed_with_the_configured_key(conn, db_url, capsys, monkeypatch):
    make_job(conn)
    assert run_cli(capsys, db_url, "head")[0] == 1  # no checkpoint yet
    assert run_cli(capsys, db_url, "checkpoint")[0] == 0
    code, out = run_cli(capsys, db_url, "head")
    assert code == 0 and len(out.splitlines()) == 1
    head = json.loads(out)
    assert head["seq"] == 1 and tool.header_hash(head).hex() == head["hash"] and "signature" not in head

    key = Ed25519PrivateKey.generate()
    seed = key.private_bytes_raw().hex()
    monkeypatch.setenv("QFORGE_AUDIT_SIGNING_KEY", seed)
    signed = json.loads(run_cli(capsys, db_url, "head")[1])
    public = audit.public_key_hex(key)
    assert signed["public_key"] == public
    assert audit.verify_head_signature(signed, public) is None
    # The auditor's checker verifies Ed25519 with the standard library alone.
    message = audit.HEAD_SIGNATURE_DOMAIN + bytes.fromhex(signed["hash"])
    assert tool.ed25519_verify(bytes.fromhex(public), message, bytes.fromhex(signed["signature"]))
    forged = dict(signed, hash="00" * 32)
    assert audit.verify_head_signature(forged, public) is not None
    assert not tool.ed25519_verify(bytes.fromhex(public), audit.HEAD_SIGNATURE_DOMAIN + b"\0" * 32,
                                   bytes.fromhex(signed["signature"]))
    other = audit.public_key_hex(Ed25519PrivateKey.generate())
    assert audit.verify_head_signature(signed, other) is not None


def test_python_encoding_equals_the_database_s(conn):
    workload(conn)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT stream_type, stream_id, version, type, schema_version, data::text AS data_text,"
            "       tags::text AS tags_text, workflow_id, occurred_at, actor, hash,"
            "       event_canonical_v1(stream_type, stream_id, version, type, schema_version, data, tags,"
            "                          workflow_id, occurred_at, actor) AS canonical,"
            "       lag(hash) OVER (PARTITION BY stream_id ORDER BY version) AS prev"
            "  FROM events").fetchall()
    assert any(r["workflow_id"] for r in rows) and any(r["tags_text"] for r in rows)
    for row in rows:
        assert audit.event_canonical_v1(row) == bytes(row["canonical"])
        assert audit.event_hash(row["prev"] and bytes(row["prev"]), row) == bytes(row["hash"])


def test_merkle_paths_lead_every_leaf_to_the_root():
    for size in (1, 2, 3, 5, 8, 13):
        leaves = [audit.merkle_leaf(i, bytes([i]) * 32) for i in range(size)]
        root = audit.merkle_root(leaves)
        for index, leaf in enumerate(leaves):
            assert audit.merkle_climb(leaf, audit.merkle_path(leaves, index)) == root
        if size > 1:
            assert audit.merkle_climb(leaves[0], audit.merkle_path(leaves, 1)) != root


# -- verify: one test per attack -----------------------------------------------


@pytest.fixture
def sealed(conn, db_url, capsys, tmp_path):
    """A log with a workload, checkpointed, and its head kept in a file outside the database."""
    ids = workload(conn)
    audit.checkpoint(conn)
    code, out = run_cli(capsys, db_url, "verify")
    assert code == 0 and "the log holds" in out, out
    anchor = tmp_path / "head.jsonl"
    anchor.write_text(run_cli(capsys, db_url, "head")[1])
    return {**ids, "anchor": anchor}


def assert_named(capsys, db_url, positions: set[int], *extra: str) -> str:
    code, out = run_cli(capsys, db_url, "verify", *extra)
    assert code == 1, out
    assert positions <= positions_named(out), out
    return out


def test_verify_names_an_event_whose_data_was_edited(conn, db_url, capsys, sealed):
    target = events_of(conn, sealed["order"])[0]
    tamper(conn, "UPDATE events SET data = jsonb_set(data, '{payload,amount}', '1250') WHERE position = %s",
           (target["position"],))
    out = assert_named(capsys, db_url, {target["position"]})
    assert f"stream={sealed['order']}" in out


def test_verify_names_an_event_whose_type_was_changed_and_rehashed(conn, db_url, capsys, sealed):
    # The attacker recomputes the edited event's hash: the chain now breaks at the next event,
    # and the checkpoint's leaf for this position no longer matches.
    first, second = events_of(conn, sealed["order"])[:2]
    tamper(conn, "UPDATE events SET type = 'Cancelled',"
                 " hash = event_hash(NULL, stream_type, stream_id, version, 'Cancelled', schema_version, data,"
                 "                   tags, workflow_id, occurred_at, actor) WHERE position = %s",
           (first["position"],))
    assert_named(capsys, db_url, {first["position"], second["position"]})


def test_verify_names_the_stream_an_event_was_deleted_from(conn, db_url, capsys, sealed):
    events = events_of(conn, sealed["order"])
    assert len(events) >= 3
    tamper(conn, "DELETE FROM events WHERE position = %s", (events[1]["position"],))
    out = assert_named(capsys, db_url, {events[1]["position"], events[2]["position"]})
    assert re.search(rf"position={events[2]['position']} stream={sealed['order']}: version 2 of the stream is"
                     " missing", out), out


def test_verify_names_a_stream_whose_newest_event_was_deleted(conn, db_url, capsys):
    ids = workload(conn)  # no checkpoint yet: only the head kept on the stream's row can tell
    *_, before_last, last = events_of(conn, ids["order"])
    tamper(conn, "DELETE FROM events WHERE position = %s", (last["position"],))
    out = assert_named(capsys, db_url, {last["position"]})
    assert f"but its last event is at position {before_last['position']}" in out


def test_verify_names_an_event_inserted_with_a_valid_hash(conn, db_url, capsys, sealed):
    # A forged completion appended to the stream as the database would hash it, slipped in
    # among already checkpointed transactions (an old xid), the row's chain head moved too.
    last = events_of(conn, sealed["other"])[-1]
    tamper(conn, "INSERT INTO events (xid, stream_type, stream_id, version, type, data, occurred_at, actor, hash)"
                 " SELECT %(xid)s, 'job', %(id)s, %(v)s, 'Succeeded', '{}', now(), 'w1',"
                 "        event_hash(%(prev)s, 'job', %(id)s, %(v)s, 'Succeeded', 1::smallint, '{}', NULL, NULL,"
                 "                   now(), 'w1')",
           {"xid": last["xid"], "id": sealed["other"], "v": last["version"] + 1, "prev": last["hash"]})
    forged = events_of(conn, sealed["other"])[-1]
    tamper(conn, "UPDATE jobs SET chain = %s, last_position = %s WHERE id = %s",
           (forged["hash"], forged["position"], sealed["other"]))
    out = assert_named(capsys, db_url, {forged["position"]})
    assert "inserted" in out


def test_verify_names_two_events_swapped(conn, db_url, capsys, sealed):
    a = events_of(conn, sealed["order"])[0]["position"]
    b = events_of(conn, sealed["other"])[0]["position"]
    # Every hash chain still holds (positions are not hashed); the checkpoint recorded which event was where.
    tamper(conn, "UPDATE events SET position = CASE position WHEN %(a)s THEN %(b)s ELSE %(a)s END"
                 " WHERE position IN (%(a)s, %(b)s)", {"a": a, "b": b})
    assert_named(capsys, db_url, {a, b})


def test_verify_names_a_stream_rewritten_with_a_consistent_chain(conn, db_url, capsys, sealed):
    events = events_of(conn, sealed["order"])
    tamper(conn, "UPDATE events SET data = jsonb_set(data, '{payload,amount}', '0') WHERE position = %s",
           (events[0]["position"],))
    rechain(conn, sealed["order"])
    out = assert_named(capsys, db_url, {e["position"] for e in events})
    assert "version" not in out  # every chain holds: only the checkpoints tell


def test_verify_with_an_anchor_names_the_newest_events_deleted_with_their_checkpoints(
        conn, db_url, capsys, sealed):
    make_job(conn)
    make_job(conn)
    audit.checkpoint(conn)
    anchor = sealed["anchor"]
    anchor.write_text(run_cli(capsys, db_url, "head")[1])
    newest = json.loads(anchor.read_text())
    gone = [r["position"] for r in conn.execute("SELECT position FROM events WHERE position >= %s ORDER BY 1",
                                       (newest["first_position"],))]
    assert len(gone) == 2
    tamper(conn, "DELETE FROM events WHERE position >= %s", (newest["first_position"],))
    tamper(conn, "DELETE FROM jobs WHERE last_position >= %s", (newest["first_position"],))
    tamper(conn, "DELETE FROM audit_checkpoints WHERE seq = %s", (newest["seq"],))
    code, out = run_cli(capsys, db_url, "verify")
    assert code == 0, out  # self-consistent: without the anchor nobody can tell
    out = assert_named(capsys, db_url, {gone[0]}, "--anchor", str(anchor))
    assert f"checkpoint {newest['seq']} is not in the database" in out


def test_verify_refuses_an_anchor_whose_signature_does_not_hold(conn, db_url, capsys, sealed, monkeypatch):
    key = Ed25519PrivateKey.generate()
    monkeypatch.setenv("QFORGE_AUDIT_SIGNING_KEY", key.private_bytes_raw().hex())
    signed = json.loads(run_cli(capsys, db_url, "head")[1])
    anchor = sealed["anchor"]
    anchor.write_text(json.dumps(dict(signed, seq=signed["seq"] + 1)))  # an edited anchor
    code, out = run_cli(capsys, db_url, "verify", "--anchor", str(anchor))
    assert code == 2 and "edited" in out
    other = Ed25519PrivateKey.generate()  # signed by someone else
    anchor.write_text(json.dumps(dict(signed, signature=other.sign(b"QFH1" + bytes.fromhex(signed["hash"])).hex())))
    code, out = run_cli(capsys, db_url, "verify", "--anchor", str(anchor))
    assert code == 2 and "signature" in out
    anchor.write_text(json.dumps(signed))
    assert run_cli(capsys, db_url, "verify", "--anchor", str(anchor))[0] == 0


def test_verify_names_checkpoints_rewritten_or_removed(conn, db_url, capsys):
    for _ in range(3):
        make_job(conn)
        audit.checkpoint(conn)
    positions = {row["seq"]: row["positions"] for row in conn.execute("SELECT seq, positions FROM audit_checkpoints")}
    tamper(conn, "UPDATE audit_checkpoints SET events = 2 WHERE seq = 1")
    tamper(conn, "DELETE FROM audit_checkpoints WHERE seq = 2")
    code, out = run_cli(capsys, db_url, "verify")
    assert code == 1, out
    assert f"position={positions[1][0]}: checkpoint 1: its leaves do not match its event count" in out, out
    assert f"position={positions[3][0]}: checkpoints 2-2 are missing" in out, out
    assert f"position={positions[2][0]}" in out  # its event is no longer covered by any checkpoint


def test_verify_reports_progress_through_its_passes_up_to_the_total(conn):
    from qforge.audit.verify import verify

    for _ in range(9):
        make_job(conn)
    audit.checkpoint(conn, max_events=3)
    heard: list[tuple[int, int | None]] = []
    report = verify(conn, progress=lambda done, total: heard.append((done, total)))
    assert not report.problems
    total = 2 * report.events + 9
    assert heard[-1] == (total, total) and len(heard) == 2 + 3  # two statements, three checkpoints
    assert all(b[0] > a[0] for a, b in zip(heard, heard[1:]))
