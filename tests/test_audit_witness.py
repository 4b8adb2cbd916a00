"""Witnessed heads: a real `qforge monitor` writes every signed head to QFORGE_AUDIT_WITNESS_DIR, and
`qforge audit verify --witness DIR` catches an attacker who rewrote events, chains and checkpoints
together (which plain `verify` cannot)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from psycopg.rows import dict_row

from qforge.audit import checkpoints as audit
from qforge.audit import witness
from test_audit import rechain, tamper
from test_worker_support import QFORGE, Processes, procs, tasks_dir, wait_for  # noqa: F401  (fixtures)
from tests.factories import make_job


def audit_cli(db_url: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    done = subprocess.run([str(QFORGE), "audit", *args, "--database-url", db_url], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})
    return done.returncode, done.stdout + done.stderr


def rewrite_everything(conn, position: int) -> int:
    """What an attacker who owns the whole database can do: edit the event at `position`, re-chain its
    stream, point its row at the new chain, and recompute every checkpoint from the one covering it
    (leaves, Merkle roots, the chain of checkpoint hashes). Returns the first checkpoint rewritten."""
    with conn.cursor(row_factory=dict_row) as cur:
        event = cur.execute("SELECT stream_id FROM events WHERE position = %s", (position,)).fetchone()
    tamper(conn, "UPDATE events SET data = data || '{\"forged\": true}' WHERE position = %s", (position,))
    rechain(conn, event["stream_id"])
    hashes = {row["position"]: bytes(row["hash"]) for row in
              conn.cursor(row_factory=dict_row).execute("SELECT position, hash FROM events")}
    with conn.cursor(row_factory=dict_row) as cur:
        points = cur.execute("SELECT * FROM audit_checkpoints ORDER BY seq").fetchall()
    first = next(p["seq"] for p in points if position in p["positions"])
    prev = None
    for point in points:
        if point["seq"] >= first:
            leaf_hashes = b"".join(hashes[p] for p in point["positions"])
            root = audit.merkle_root(audit.leaves_of(point["positions"], leaf_hashes))
            cursor_xid = int(str(point["cursor_xid"]))
            new_hash = audit.checkpoint_hash(prev, point["seq"], point["created_at"], cursor_xid,
                                             point["cursor_position"], point["events"], root)
            tamper(conn, "UPDATE audit_checkpoints SET hashes = %s, root = %s, prev = %s, hash = %s"
                         " WHERE seq = %s", (leaf_hashes, root, prev, new_hash, point["seq"]))
            prev = new_hash
        else:
            prev = bytes(point["hash"])
    return first


def test_the_leader_witnesses_each_head_and_verify_catches_a_rewrite_of_everything(conn, db_url, procs: Processes,
                                                                                    tmp_path: Path):
    key = Ed25519PrivateKey.generate().private_bytes_raw().hex()
    folder = tmp_path / "witness"
    env = {"QFORGE_AUDIT_CHECKPOINT_SECONDS": "0.3", "QFORGE_AUDIT_WITNESS_DIR": str(folder),
           "QFORGE_AUDIT_SIGNING_KEY": key}
    procs.monitor(env)
    target = make_job(conn, payload={"amount": 12})
    wait_for(lambda: witness.newest_seq(folder) >= 1, timeout=30, message="the first witnessed head")
    make_job(conn)
    wait_for(lambda: len(witness.head_files(folder)) >= 2, timeout=30, message="a second witnessed head")
    files = witness.head_files(folder)
    heads = [json.loads(path.read_text()) for path in files]
    assert [h["seq"] for h in heads] == sorted({h["seq"] for h in heads})  # one file per checkpoint
    assert all("signature" in h for h in heads)
    assert all(path.stat().st_mode & 0o222 == 0 for path in files)  # written once, read-only
    code, out = audit_cli(db_url, "verify", "--witness", str(folder), env={"QFORGE_AUDIT_SIGNING_KEY": key})
    assert code == 0 and "the log holds" in out, out

    with conn.cursor() as cur:
        position = cur.execute("SELECT min(position) AS p FROM events WHERE stream_id = %s", (target,)).fetchone()["p"]
    first = rewrite_everything(conn, position)
    code, out = audit_cli(db_url, "verify")
    assert code == 0, out  # self-consistent: without a witness nobody can tell
    code, out = audit_cli(db_url, "verify", "--witness", str(folder), env={"QFORGE_AUDIT_SIGNING_KEY": key})
    assert code == 1, out
    assert f"checkpoint {first} differs from the anchor's: the checkpoints were rewritten" in out, out
    assert position in {int(p) for p in re.findall(r"^position=(\d+)", out, re.MULTILINE)}, out
    # The witness keeps what it saw: the rewritten checkpoints never replace a file.
    assert [json.loads(path.read_text()) for path in files] == heads


def test_a_head_is_written_once_and_a_different_head_for_the_same_checkpoint_lands_beside_it(conn, tmp_path):
    make_job(conn)
    audit.checkpoint(conn)
    folder = tmp_path / "witness"
    (written,) = witness.witness(conn, folder, signing_key=None)
    assert witness.witness(conn, folder, signing_key=None) == []  # nothing new
    line = json.loads(written.read_text())
    assert witness.write(folder, line) is None  # the same head again: left as it is
    forged = dict(line, hash="f" * 64)
    beside = witness.write(folder, forged)
    assert beside is not None and beside != written
    assert json.loads(written.read_text()) == line
    assert witness.newest_seq(folder) == line["seq"]


def test_verify_refuses_a_witness_directory_without_heads_or_with_an_edited_one(conn, db_url, tmp_path):
    make_job(conn)
    audit.checkpoint(conn)
    folder = tmp_path / "witness"
    folder.mkdir()
    code, out = audit_cli(db_url, "verify", "--witness", str(folder))
    assert code == 2 and "holds no head" in out, out
    (written,) = witness.witness(conn, folder, signing_key=None)
    edited = json.loads(written.read_text())
    written.chmod(0o644)
    written.write_text(json.dumps(dict(edited, events=edited["events"] + 1)))
    code, out = audit_cli(db_url, "verify", "--witness", str(folder))
    assert code == 2 and written.name in out and "edited" in out, out
