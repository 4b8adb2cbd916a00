#!/usr/bin/env python3
"""Check a QForge audit proof against a head line, with nothing but the Python standard library.

    python3 verify_audit_proof.py PROOF_FILE HEAD_FILE [--public-key HEX]

PROOF_FILE comes from `GET /jobs/{id}/proof`, `GET /workflows/{id}/proof` or
`qforge audit export ID`; HEAD_FILE holds a line of `qforge audit head` that
you kept outside the database (the last line of the file is used). Exit 0 when
the proof holds: every event's hash matches its contents and the hash before
it in its stream, every event is a leaf of a checkpoint, and the chain of
checkpoints reaches the head. Exit 1 otherwise, with a line per problem
(`position=<N>` for an event); exit 2 when a file cannot be read. With
--public-key (the Ed25519 key, hex, that signs your heads) the head's
signature must hold too.

This one file is the whole checker, so that an auditor can read it and run it
without installing QForge or trusting its server. QForge imports it too
(qforge.tools.verify_audit_proof): the encodings below are the only copy.
The formats are described in QForge's docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Mapping, Sequence

PG_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)
EVENT_MAGIC = b"QFE1"
CHECKPOINT_MAGIC = b"QFC1"
HEAD_SIGNATURE_DOMAIN = b"QFH1"


# -- Events -------------------------------------------------------------------


def microseconds_since_2000(moment: datetime) -> int:
    """PostgreSQL's binary timestamp: microseconds since 2000-01-01 UTC (exact: timedelta is)."""
    return (moment - PG_EPOCH) // timedelta(microseconds=1)


def _text(value: str) -> bytes:
    encoded = value.encode("utf-8")
    return struct.pack(">i", len(encoded)) + encoded


def event_canonical_v1(event: Mapping[str, Any]) -> bytes:
    """The bytes an event's hash covers (event_canonical_v1 in the database).

    `event` holds the stored columns, with `data_text` and `tags_text` as the
    database renders the jsonb (`data::text`, `tags::text`; tags None when the
    event has none): the hash covers that text exactly.
    """
    if "occurred_us" in event:  # an archive segment's line carries the exact integer too
        occurred_us = event["occurred_us"]
    else:
        occurred_at = event["occurred_at"]
        occurred_us = microseconds_since_2000(
            datetime.fromisoformat(occurred_at) if isinstance(occurred_at, str) else occurred_at)
    workflow_id = event.get("workflow_id")
    tags_text = event.get("tags_text")
    return b"".join((
        EVENT_MAGIC,
        uuid.UUID(str(event["stream_id"])).bytes,
        struct.pack(">ihq", event["version"], event["schema_version"], occurred_us),
        _text(event["stream_type"]), _text(event["type"]), _text(event["actor"]),
        b"\x00" if workflow_id is None else b"\x01" + uuid.UUID(str(workflow_id)).bytes,
        b"\xff\xff\xff\xff" if tags_text is None else _text(tags_text),
        event["data_text"].encode("utf-8"),
    ))


def event_hash(prev: bytes | None, event: Mapping[str, Any]) -> bytes:
    """SHA-256(the previous hash in the stream, empty for the first event || canonical encoding)."""
    return hashlib.sha256((prev or b"") + event_canonical_v1(event)).digest()


# -- Merkle trees and checkpoints ----------------------------------------------
# A leaf binds an event's hash to its position; an inner node hashes its two
# children; an odd node at the end of a level moves up unchanged. The 0/1
# prefixes keep a leaf from passing for a node (as in RFC 6962).


def merkle_leaf(position: int, hash_: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + struct.pack(">q", position) + hash_).digest()


def merkle_node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def merkle_climb(leaf: bytes, path: Iterable[Sequence[str]]) -> bytes:
    """The root that a leaf and its path of siblings (["L"|"R", hex], leaf upwards) lead to."""
    node = leaf
    for side, sibling_hex in path:
        sibling = bytes.fromhex(sibling_hex)
        node = merkle_node(sibling, node) if side == "L" else merkle_node(node, sibling)
    return node


def checkpoint_hash(prev: bytes | None, seq: int, created_at: datetime, cursor_xid: int, cursor_position: int,
                    events: int, root: bytes) -> bytes:
    """SHA-256(previous checkpoint's hash, empty for the first || "QFC1" || five int64, big-endian || root)."""
    header = struct.pack(">qqqqq", seq, microseconds_since_2000(created_at), cursor_xid, cursor_position, events)
    return hashlib.sha256((prev or b"") + CHECKPOINT_MAGIC + header + root).digest()


def header_hash(header: Mapping[str, Any]) -> bytes:
    """The hash of a checkpoint as a proof or a head carries it (hex fields, ISO time)."""
    return checkpoint_hash(bytes.fromhex(header["prev"]) if header.get("prev") else None, int(header["seq"]),
                           datetime.fromisoformat(header["created_at"]), int(header["cursor_xid"]),
                           int(header["cursor_position"]), int(header["events"]), bytes.fromhex(header["root"]))


# -- Ed25519 verification (RFC 8032, section 5.1.7), for signed heads ----------

_P = 2**255 - 19
_L = 2**252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)


def _add(a: tuple, b: tuple) -> tuple:
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    aa, bb = (y1 - x1) * (y2 - x2) % _P, (y1 + x1) * (y2 + x2) % _P
    cc, dd = t1 * 2 * _D * t2 % _P, z1 * 2 * z2 % _P
    e, f, g, h = bb - aa, dd - cc, dd + cc, bb + aa
    return e * f % _P, g * h % _P, f * g % _P, e * h % _P


def _multiply(scalar: int, point: tuple) -> tuple:
    result = (0, 1, 1, 0)
    while scalar:
        if scalar & 1:
            result = _add(result, point)
        point = _add(point, point)
        scalar >>= 1
    return result


def _recover_x(y: int, sign: int) -> int | None:
    if y >= _P:
        return None
    x2 = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    if x2 == 0:
        return None if sign else 0
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P:
        return None
    return _P - x if (x & 1) != sign else x


def _decompress(encoded: bytes) -> tuple | None:
    if len(encoded) != 32:
        return None
    y = int.from_bytes(encoded, "little")
    sign, y = y >> 255, y & ((1 << 255) - 1)
    x = _recover_x(y, sign)
    return None if x is None else (x, y, 1, x * y % _P)


_BASE_Y = 4 * pow(5, _P - 2, _P) % _P
_BASE = (_recover_x(_BASE_Y, 0), _BASE_Y, 1, _recover_x(_BASE_Y, 0) * _BASE_Y % _P)


def ed25519_verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    if len(signature) != 64:
        return False
    a, r = _decompress(public_key), _decompress(signature[:32])
    s = int.from_bytes(signature[32:], "little")
    if a is None or r is None or s >= _L:
        return False
    h = int.from_bytes(hashlib.sha512(signature[:32] + public_key + message).digest(), "little") % _L
    left, right = _multiply(s, _BASE), _add(r, _multiply(h, a))
    return (left[0] * right[2] - right[0] * left[2]) % _P == 0 and (left[1] * right[2] - right[1] * left[2]) % _P == 0


# -- The proof ------------------------------------------------------------------


def check_proof(proof: Mapping[str, Any], head: Mapping[str, Any], public_key: str | None = None) -> list[str]:
    """Every problem of `proof` against `head`, one line each; [] when it holds."""
    problems: list[str] = []
    if public_key is not None:
        signature = head.get("signature")
        if not signature:
            problems.append("head: not signed, but a public key was given")
        elif not ed25519_verify(bytes.fromhex(public_key), HEAD_SIGNATURE_DOMAIN + bytes.fromhex(head["hash"]),
                                bytes.fromhex(signature)):
            problems.append("head: the Ed25519 signature does not hold for this public key")
    if header_hash(head).hex() != head["hash"]:
        problems.append(f"head: checkpoint {head['seq']}'s hash does not match its fields")
    head_seq = int(head["seq"])

    # The chain of checkpoints, from the first that covers an event up to the head.
    headers = {int(h["seq"]): h for h in proof.get("checkpoints", [])}
    chained: dict[int, Mapping[str, Any]] = {}
    if head_seq not in headers:
        problems.append(f"head: the proof's checkpoints do not reach checkpoint {head_seq} (a newer proof is needed,"
                        " or an older head)")
    elif headers[head_seq]["hash"] != head["hash"]:
        problems.append(f"head: checkpoint {head_seq} of the proof is not the head's")
    else:
        seq = head_seq
        chained[seq] = headers[seq]
        while seq - 1 in headers:
            below = headers[seq - 1]
            if header_hash(below).hex() != below["hash"] or headers[seq].get("prev") != below["hash"]:
                problems.append(f"checkpoint {seq - 1}: does not chain to checkpoint {seq}")
                break
            seq -= 1
            chained[seq] = below
        if header_hash(headers[head_seq]).hex() != headers[head_seq]["hash"]:
            problems.append(f"checkpoint {head_seq}: its hash does not match its fields")

    # Each stream's chain, from its first event, and each event's leaf.
    streams: dict[str, list[Mapping[str, Any]]] = {}
    for event in proof.get("events", []):
        streams.setdefault(str(event["stream_id"]), []).append(event)
    for stream_id, events in streams.items():
        prev: bytes | None = None
        for expected_version, event in enumerate(sorted(events, key=lambda e: e["version"]), start=1):
            where = f"position={event['position']} stream={stream_id}"
            if event["version"] != expected_version:
                problems.append(f"{where}: version {event['version']} where version {expected_version} belongs")
            stored = bytes.fromhex(event["hash"])
            # A proof served to a read token masks secret-looking fields ("redacted": true): those
            # bytes are not the hashed ones, so only this one comparison is left out (main lists
            # the event as withheld); its place in its stream and in the checkpoints still holds.
            if not event.get("redacted") and event_hash(prev, event) != stored:
                problems.append(f"{where}: the hash does not match the event's contents and the hash before it")
            prev = stored
            seq = event.get("checkpoint")
            if seq is None or int(seq) > head_seq:
                problems.append(f"{where}: no checkpoint up to the head covers this event yet")
            elif int(seq) not in chained:
                problems.append(f"{where}: checkpoint {seq} is not chained to the head")
            elif merkle_climb(merkle_leaf(event["position"], stored), event.get("merkle_path") or []).hex() \
                    != chained[int(seq)]["root"]:
                problems.append(f"{where}: not a leaf of checkpoint {seq}")
    if not streams:
        problems.append("the proof holds no events")
    return problems


def _load(path: str, last_line: bool = False) -> Any:
    with open(path, encoding="utf-8") as file:
        text = file.read()
    if last_line:
        lines = [line for line in text.splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    return json.loads(text)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    public_key = None
    if "--public-key" in args:
        at = args.index("--public-key")
        if at + 1 >= len(args):
            print("verify_audit_proof: --public-key needs a hex key", file=sys.stderr)
            return 2
        public_key = args[at + 1]
        del args[at:at + 2]
    if len(args) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        proof, head = _load(args[0]), _load(args[1], last_line=True)
        problems = check_proof(proof, head, public_key)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"verify_audit_proof: cannot read the proof or the head: {exc!r}", file=sys.stderr)
        return 2
    for problem in problems:
        print(problem)
    if problems:
        print(f"the proof does NOT hold: {len(problems)} problem(s)")
        return 1
    streams = {e["stream_id"] for e in proof["events"]}
    withheld = [e for e in proof["events"] if e.get("redacted")]
    for event in withheld:
        print(f"withheld: position={event['position']} stream={event['stream_id']}: its contents were redacted"
              " (a proof for a read token); its hash is checked in the chain and the checkpoints, not against"
              " its contents")
    print(f"the proof holds: {proof.get('kind', 'execution')} {proof.get('id')}: {len(proof['events'])} events"
          f" in {len(streams)} stream(s), verified up to checkpoint {head['seq']} (head of {head['created_at']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
