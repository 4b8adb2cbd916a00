"""Proofs: an execution's events with their hashes, the Merkle paths into the checkpoints covering them, and the chain of checkpoints up to the newest.

A proof is checked alone, against a head kept outside the database, by
tools/verify_audit_proof.py (standard library only); `check` runs that same
checker here, for the dashboard's "verified up to checkpoint N".
"""

from __future__ import annotations

from datetime import timedelta, timezone
from pathlib import Path
from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from qforge.events import audit, segments
from qforge.sql import q
from qforge.tools.verify_audit_proof import PG_EPOCH, check_proof


def proof(conn, kind: str, execution_id: UUID, *, archive: Path | None = None) -> dict[str, Any] | None:
    """The proof for a job or a workflow (None when the live log has none of its events), read in one
    snapshot. A stream whose first events were archived is completed from the segments of the
    archive directory `archive`, when given (else the proof starts where the live log does, and
    does not hold alone)."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(q("log_read_lock"))
            rows = cur.execute(q("audit_proof_events"), {"id": execution_id}).fetchall()
            if not rows or not any(r["stream_id"] == execution_id and r["stream_type"] == kind for r in rows):
                return None
            if archive is not None:
                rows = _archived_rows(cur, archive, rows) + rows
            seqs = sorted({r["checkpoint"] for r in rows if r["checkpoint"] is not None})
            recorded = cur.execute(q("audit_checkpoint_leaves"), {"seqs": seqs}).fetchall()
            leaves = {row["seq"]: audit.leaves_of(row["positions"], bytes(row["hashes"])) for row in recorded}
            index_of = {row["seq"]: {position: i for i, position in enumerate(row["positions"])}
                        for row in recorded}
            headers = [audit.Checkpoint.from_row(row).header() for row in cur.execute(
                q("audit_checkpoint_headers"), {"leaves": False, "from_seq": seqs[0] if seqs else 2**62})]
            newest = cur.execute(q("audit_head"), {"seq": None}).fetchone()
    if newest is not None and not headers:
        # Nothing covered yet: the newest header still tells the auditor where the checkpoints stand.
        headers = [audit.Checkpoint.from_row(newest).header()]
    events = []
    for row in rows:
        seq = row["checkpoint"]
        index = index_of.get(seq, {}).get(row["position"]) if seq is not None else None
        events.append({
            "position": row["position"], "xid": row["xid"], "stream_type": row["stream_type"],
            "stream_id": str(row["stream_id"]), "version": row["version"], "type": row["type"],
            "schema_version": row["schema_version"], "data_text": row["data_text"], "tags_text": row["tags_text"],
            "workflow_id": None if row["workflow_id"] is None else str(row["workflow_id"]),
            "occurred_at": row["occurred_at"].astimezone(timezone.utc).isoformat(), "actor": row["actor"],
            "hash": bytes(row["hash"]).hex(),
            "checkpoint": seq,
            # No index: the checkpoint did not record this position (the log was changed after it).
            "merkle_path": audit.merkle_path(leaves[seq], index) if index is not None else None,
        })
    return {"qforge_audit_proof": 1, "kind": kind, "id": str(execution_id), "events": events,
            "checkpoints": headers}


def _archived_rows(cur, directory: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The archived events of the streams whose live events do not start at version 1, as rows
    shaped like audit_proof_events', with the checkpoints covering them."""
    first: dict[UUID, int] = {}
    for row in rows:
        first[row["stream_id"]] = min(first.get(row["stream_id"], row["version"]), row["version"])
    wanted = {stream for stream, version in first.items() if version > 1}
    # The Bloom filters of archive_segments name the segments that may hold each stream.
    files = sorted({held["segment"] for stream in wanted
                    for held in cur.execute(q("archive_holding"), {"id": stream}).fetchall()})
    lines = [line for name in files for line in segments.read_segment(Path(directory) / f"{name}.jsonl.gz")
             if UUID(line["stream_id"]) in wanted and line["version"] < first[UUID(line["stream_id"])]]
    covering = {row["position"]: row["checkpoint"] for row in cur.execute(q("audit_covering"), {
        "xids": [int(line["xid"]) for line in lines], "positions": [line["position"] for line in lines]})}
    return [{"position": line["position"], "xid": int(line["xid"]), "stream_type": line["stream_type"],
             "stream_id": UUID(line["stream_id"]), "version": line["version"], "type": line["type"],
             "schema_version": line["schema_version"], "data_text": line["data"], "tags_text": line["tags"],
             "workflow_id": None if line["workflow_id"] is None else UUID(line["workflow_id"]),
             "occurred_at": PG_EPOCH + timedelta(microseconds=line["occurred_us"]), "actor": line["actor"],
             "hash": bytes.fromhex(line["hash"]), "checkpoint": covering.get(line["position"])}
            for line in lines]


def check(proof_: dict[str, Any]) -> dict[str, Any]:
    """The proof checked against its own newest checkpoint, as the dashboard shows it.

    This says the live log still matches the checkpoints for this execution; an
    auditor who does not trust the server checks the proof against a head they
    kept (tools/verify_audit_proof.py).
    """
    covered = [e["checkpoint"] for e in proof_["events"] if e["checkpoint"] is not None]
    if not proof_["checkpoints"] or not covered:
        return {"verified": False, "checkpoint": None, "covered": 0, "events": len(proof_["events"]),
                "problems": ["no checkpoint covers this execution yet"]}
    newest = proof_["checkpoints"][-1]
    problems = check_proof(proof_, newest)
    # Events after the newest checkpoint are not a problem of the log: they are just not vouched for yet.
    pending = [p for p in problems if p.endswith("no checkpoint up to the head covers this event yet")]
    problems = [p for p in problems if p not in pending]
    return {"verified": not problems, "checkpoint": max(covered), "covered": len(covered),
            "events": len(proof_["events"]), "problems": problems}


def proof_with_status(conn, kind: str, execution_id: UUID, *, archive: Path | None = None) -> dict[str, Any] | None:
    """The proof with the server's own check of it under `status` (what the API answers)."""
    found = proof(conn, kind, execution_id, archive=archive)
    return None if found is None else {**found, "status": check(found)}
