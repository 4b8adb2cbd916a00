"""Proofs: an execution's events with their hashes, the Merkle paths into the checkpoints covering them, and the chain of checkpoints up to the newest.

A proof is checked alone, against a head kept outside the database, by
tools/verify_audit_proof.py (standard library only); `check` runs that same
checker here, for the dashboard's "verified up to checkpoint N".
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import timedelta, timezone
from pathlib import Path
from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from qforge.log import segments
from qforge.audit import checkpoints as audit
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
            rows = cur.execute(q("audit_proof_events"), {"id": execution_id, "after_stream": NIL,
                                                         "after_version": 0, "limit": None}).fetchall()
            if not _is_of(rows, kind, execution_id):
                return None
            if archive is not None:
                rows = _archived_rows(cur, archive, rows) + rows
            events = _events_of(cur, rows)
            seqs = [e["checkpoint"] for e in events if e["checkpoint"] is not None]
            headers = [audit.Checkpoint.from_row(row).header() for row in cur.execute(
                q("audit_checkpoint_headers"), {"leaves": False, "from_seq": min(seqs) if seqs else 2**62})]
            newest = cur.execute(q("audit_head"), {"seq": None}).fetchone()
    if newest is not None and not headers:
        # Nothing covered yet: the newest header still tells the auditor where the checkpoints stand.
        headers = [audit.Checkpoint.from_row(newest).header()]
    return {"qforge_audit_proof": 1, "kind": kind, "id": str(execution_id), "events": events,
            "checkpoints": headers}


def _is_of(rows: list[dict[str, Any]], kind: str, execution_id: UUID) -> bool:
    return any(r["stream_id"] == execution_id and r["stream_type"] == kind for r in rows)


def _events_of(cur, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The proof's events for these rows, each with its Merkle path into the checkpoint covering it."""
    seqs = sorted({r["checkpoint"] for r in rows if r["checkpoint"] is not None})
    recorded = cur.execute(q("audit_checkpoint_leaves"), {"seqs": seqs}).fetchall()
    leaves = {row["seq"]: audit.leaves_of(row["positions"], bytes(row["hashes"])) for row in recorded}
    index_of = {row["seq"]: {position: i for i, position in enumerate(row["positions"])} for row in recorded}
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
    return events


# ---------------------------------------------------------------------------------------- pages
# GET /jobs/{id}/proof and /workflows/{id}/proof answer in pages of about QFORGE_API_PAGE_BYTES:
# first the events (in stream and version order, PAGE_EVENTS read at a time), then the checkpoint
# headers from the lowest one an event named up to the newest (PAGE_HEADERS at a time). Joined
# (every page's events and checkpoints), the pages are the proof `proof()` makes.

PAGE_EVENTS = 200
PAGE_HEADERS = 2000
NIL = UUID(int=0)


def encode_proof_cursor(state: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(state, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_proof_cursor(text: str | None) -> dict[str, Any]:
    """The state a proof page goes on from; ValueError for a cursor this module did not make."""
    if not text:
        return {"phase": "events", "stream": str(NIL), "version": 0, "min": None, "seq": 0, "page": 0}
    try:
        state = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        if state["phase"] not in ("events", "checkpoints"):
            raise ValueError
        UUID(str(state["stream"]))
        for key in ("version", "page", "seq"):
            if not isinstance(state[key], int) or not 0 <= state[key] < 2**62:
                raise ValueError
        if state["min"] is not None and (not isinstance(state["min"], int) or not 0 <= state["min"] < 2**62):
            raise ValueError
        return state
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError):
        raise ValueError(f"malformed cursor {text[:80]!r}: pass back the 'next' of a previous proof page") from None


def proof_page(conn, kind: str, execution_id: UUID, *, cursor: str | None = None, max_bytes: int,
               archive: Path | None = None) -> dict[str, Any] | None:
    """One page of the proof (None when the live log has none of the execution's events), with
    `next` (null on the last page). The archived events a stream begins with come on the first
    page. `status` is the server's check when the whole proof fits in one page."""
    state = decode_proof_cursor(cursor)
    events: list[dict[str, Any]] = []
    headers: list[dict[str, Any]] = []
    size = 0
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(q("log_read_lock"))
            if state["page"] == 0 and not _is_of(cur.execute(q("audit_proof_owner"), {"id": execution_id}
                                                             ).fetchall(), kind, execution_id):
                return None
            while state["phase"] == "events":
                rows = cur.execute(q("audit_proof_events"), {
                    "id": execution_id, "after_stream": state["stream"], "after_version": state["version"],
                    "limit": PAGE_EVENTS}).fetchall()
                archived = _archived_rows(cur, archive, rows) if state["page"] == 0 and not events and archive else []
                rows = archived + rows
                for index, event in enumerate(_events_of(cur, rows)):
                    weight = len(json.dumps(event))
                    # never cut among the archived events: the cursor goes on in the live log's order
                    if index >= len(archived) and (events or headers) and size + weight > max_bytes:
                        return _page(kind, execution_id, events, headers, state)
                    events.append(event)
                    size += weight
                    state.update(stream=event["stream_id"], version=event["version"])
                    if event["checkpoint"] is not None:
                        state["min"] = min(state["min"] or event["checkpoint"], event["checkpoint"])
                if len(rows) < PAGE_EVENTS:
                    state["phase"] = "checkpoints"
            while state["phase"] == "checkpoints":
                if state["min"] is None:  # no event covered yet: the newest header says where checkpoints stand
                    newest = cur.execute(q("audit_head"), {"seq": None}).fetchone() if not state["seq"] else None
                    found = [] if newest is None else [newest]
                else:
                    found = cur.execute(q("audit_checkpoint_headers_page"), {
                        "from_seq": max(state["min"], state["seq"]), "limit": PAGE_HEADERS}).fetchall()
                for row in found:
                    header = audit.Checkpoint.from_row(row).header()
                    weight = len(json.dumps(header, default=str))
                    if (events or headers) and size + weight > max_bytes:
                        return _page(kind, execution_id, events, headers, state)
                    headers.append(header)
                    size += weight
                    state["seq"] = int(row["seq"]) + 1
                if len(found) < PAGE_HEADERS or state["min"] is None:
                    break
    return _page(kind, execution_id, events, headers, None if state["page"] == 0 else state, last=True)


def _page(kind: str, execution_id: UUID, events: list, headers: list, state: dict[str, Any] | None,
          last: bool = False) -> dict[str, Any]:
    page: dict[str, Any] = {"qforge_audit_proof": 1, "kind": kind, "id": str(execution_id), "events": events,
                            "checkpoints": headers}
    if last and state is None:  # the whole proof in one page: the server checks it
        return {**page, "status": check(page), "next": None}
    status = {"verified": False, "checkpoint": None, "covered": 0, "events": len(events),
              "problems": ["this proof spans several pages: join the events and checkpoints of every page"
                           " (or run `qforge audit export ID`) and check it with tools/verify_audit_proof.py"]}
    return {**page, "status": status,
            "next": None if last else encode_proof_cursor({**state, "page": (state or {}).get("page", 0) + 1})}


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
