"""The audit's hashes and checkpoints: the canonical encoding in Python, Merkle trees, chained checkpoints, heads.

The database computes each event's hash when it appends it
(event_canonical_v1, definitions/10_log.sql); this module is the same
encoding in Python, for what is checked outside the database (archive
segments, proofs), and the checkpoints over the global order (migration
0008): every checkpoint covers the events that a gapless reader could see
since the previous one, in (xid, position) order, through a Merkle tree of
their positions and hashes, and chains to the previous checkpoint's hash.
docs/ARCHITECTURE.md ("The tamper-evident log") writes the encodings down.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from psycopg.rows import dict_row

from qforge.sql import q
# The encodings an auditor checks live in one standalone file (standard library
# only) that the package imports: one copy, read by both sides.
from qforge.tools.verify_audit_proof import (  # noqa: F401  (re-exported)
    CHECKPOINT_MAGIC, EVENT_MAGIC, HEAD_SIGNATURE_DOMAIN, checkpoint_hash, event_canonical_v1, event_hash,
    merkle_climb, merkle_leaf, merkle_node, microseconds_since_2000)

# Fixed key of the checkpointers' lock ("QForge" in ASCII plus 14, for the issue).
CHECKPOINT_LOCK_KEY = 0x5146_6F72_6765_000E
# Events per checkpoint at most: a first checkpoint of a large log is a series of
# them (each one a bounded read, a bounded row), made one after the other.
CHECKPOINT_MAX_EVENTS = 100_000
HASH_BYTES = 32


# -- Merkle trees over a checkpoint's events (the writer's side) ----------------


def _levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
    if not leaves:
        raise ValueError("a Merkle tree needs at least one leaf")
    levels = [list(leaves)]
    while len(levels[-1]) > 1:
        level = levels[-1]
        up = [merkle_node(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            up.append(level[-1])
        levels.append(up)
    return levels


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    return _levels(leaves)[-1][0]


def merkle_path(leaves: Sequence[bytes], index: int) -> list[list[str]]:
    """The siblings from leaf `index` up to the root: [["L"|"R", hex], ...] (the side the sibling is on)."""
    path: list[list[str]] = []
    for level in _levels(leaves)[:-1]:
        sibling = index ^ 1
        if sibling < len(level):
            path.append(["L" if sibling < index else "R", level[sibling].hex()])
        index //= 2
    return path


def leaves_of(positions: Sequence[int], hashes: bytes) -> list[bytes]:
    return [merkle_leaf(position, hashes[i * HASH_BYTES:(i + 1) * HASH_BYTES])
            for i, position in enumerate(positions)]


# -- Checkpoints --------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    created_at: datetime
    cursor_xid: int
    cursor_position: int
    events: int
    root: bytes
    prev: bytes | None
    hash: bytes

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Checkpoint":
        return cls(row["seq"], row["created_at"], row["cursor_xid"], row["cursor_position"], row["events"],
                   bytes(row["root"]), None if row["prev"] is None else bytes(row["prev"]), bytes(row["hash"]))

    def header(self) -> dict[str, Any]:
        """What a proof or a head carries of a checkpoint: everything its hash covers."""
        return {"seq": self.seq, "created_at": self.created_at.astimezone(timezone.utc).isoformat(),
                "cursor_xid": self.cursor_xid, "cursor_position": self.cursor_position,
                "events": self.events, "root": self.root.hex(),
                "prev": None if self.prev is None else self.prev.hex(), "hash": self.hash.hex()}

    def recomputed_hash(self) -> bytes:
        return checkpoint_hash(self.prev, self.seq, self.created_at, self.cursor_xid, self.cursor_position,
                               self.events, self.root)


def checkpoint(conn, *, max_events: int = CHECKPOINT_MAX_EVENTS,
               max_checkpoints: int | None = None) -> list[Checkpoint]:
    """Record checkpoints over every event a gapless reader sees now and no checkpoint covers yet.

    One transaction per checkpoint, under the checkpointers' lock; none when
    nothing is new; at most `max_checkpoints` (None: until caught up). Returns
    what was recorded, oldest first.
    """
    made: list[Checkpoint] = []
    while max_checkpoints is None or len(made) < max_checkpoints:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(q("audit_lock"), {"key": CHECKPOINT_LOCK_KEY})
            last = cur.execute(q("audit_last")).fetchone()
            now = cur.execute(q("audit_now")).fetchone()["now"]
            cursor = (last["cursor_xid"], last["cursor_position"]) if last else (0, 0)
            rows = cur.execute(q("audit_pending"), {"xid": cursor[0], "position": cursor[1],
                                                    "limit": max_events}).fetchall()
            if not rows:
                return made
            positions = [row["position"] for row in rows]
            hashes = b"".join(bytes(row["hash"]) for row in rows)
            root = merkle_root(leaves_of(positions, hashes))
            prev = bytes(last["hash"]) if last else None
            seq = last["seq"] + 1 if last else 1
            made_now = Checkpoint(seq, now, rows[-1]["xid"], rows[-1]["position"], len(rows), root, prev,
                                  checkpoint_hash(prev, seq, now, rows[-1]["xid"], rows[-1]["position"],
                                                  len(rows), root))
            cur.execute(q("audit_checkpoint_insert"), {
                "seq": seq, "created_at": now, "cursor_xid": made_now.cursor_xid,
                "cursor_position": made_now.cursor_position, "events": len(rows), "positions": positions,
                "hashes": hashes, "root": root, "prev": prev, "hash": made_now.hash})
        made.append(made_now)
        if len(rows) < max_events:
            return made
    return made


# -- Heads: the newest checkpoint, kept outside the database -------------------


class SigningKeyError(ValueError):
    """QFORGE_AUDIT_SIGNING_KEY is set but names no Ed25519 private key."""


def load_signing_key(value: str):
    """An Ed25519 private key from 64 hex digits (its 32-byte seed) or the path of a PEM file."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    text = value.strip()
    try:
        if len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text):
            return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(text))
        pem = text.encode() if text.startswith("-----BEGIN") else Path(os.path.expanduser(text)).read_bytes()
        key = serialization.load_pem_private_key(pem, password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise SigningKeyError("QFORGE_AUDIT_SIGNING_KEY must be 64 hex digits (an Ed25519 seed) or the path"
                              f" of an unencrypted PEM Ed25519 private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError("QFORGE_AUDIT_SIGNING_KEY names a PEM key that is not Ed25519")
    return key


def public_key_hex(private_key) -> str:
    from cryptography.hazmat.primitives import serialization

    return private_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                 serialization.PublicFormat.Raw).hex()


def head(conn, *, signing_key: str | None = None, seq: int | None = None) -> dict[str, Any] | None:
    """The newest checkpoint (or checkpoint `seq`) as a head (None before the first), signed when a
    key is given.

    The signature is Ed25519 over "QFH1" || the checkpoint's hash, which binds
    every other field of the header; the public key is in the line for
    convenience, but an auditor checks it against the one they were given.
    """
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(q("audit_head"), {"seq": seq}).fetchone()
    if row is None:
        return None
    line = {"qforge_audit_head": 1, **Checkpoint.from_row(row).header(),
            "first_position": row["first_position"], "last_position": row["last_position"]}
    if signing_key:
        key = load_signing_key(signing_key)
        line["signature"] = key.sign(HEAD_SIGNATURE_DOMAIN + bytes(row["hash"])).hex()
        line["public_key"] = public_key_hex(key)
    return line


def head_line(line: Mapping[str, Any]) -> str:
    return json.dumps(line, separators=(",", ":"))


def verify_head_signature(line: Mapping[str, Any], public_key: str | None) -> str | None:
    """None when the head's signature holds under `public_key` (hex; default the line's own), else why not."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if "signature" not in line:
        return "the head is not signed" if public_key else None
    key_hex = public_key or line.get("public_key")
    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(key_hex or ""))
        key.verify(bytes.fromhex(line["signature"]), HEAD_SIGNATURE_DOMAIN + bytes.fromhex(line["hash"]))
    except (InvalidSignature, ValueError, TypeError):
        return "the head's Ed25519 signature does not verify" + ("" if public_key else " with its own public key")
    return None
