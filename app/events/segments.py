"""Archive segments: a partition of the log written out as a file an auditor can read, verify and replay.

A segment is `<name>.jsonl.gz`: one JSON object per event, in position order,
with the full envelope as stored (data and tags as the exact jsonb text the
hash covers, so nothing is lost to a JSON round trip), gzip-compressed; and
`<name>.manifest.json`: what it holds (positions, count, time range, schema
versions, the SHA-256 of the file) and a Bloom filter of its stream ids.
Files are written to a temporary name, synced, and renamed: a segment either
exists whole or not at all. Python's standard library reads both.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import math
import os
import struct
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator
from uuid import UUID

from qforge.tools import verify_audit_proof as audit_encoding

FORMAT = "qforge-archive-segment-v1"
# Bits set per stream id, and bits per id: about one false positive in 10,000
# lookups per segment, so an unknown id is almost never taken for an archived one.
BLOOM_HASHES = 13
BLOOM_BITS_PER_ID = 19.2


def segment_name(lower: int, upper: int) -> str:
    return f"events-{lower:019d}-{upper:019d}"


def micros_since_2000(moment: datetime) -> int:
    """What PostgreSQL's binary form of a timestamptz holds (the canonical encoding's occurred_at)."""
    return audit_encoding.microseconds_since_2000(moment)


# --------------------------------------------------------------------------- the hash of an event
# The encoding lives once, in the auditor's standalone checker (tools/verify_audit_proof.py).


def event_hash(prev: bytes | None, event: dict[str, Any]) -> bytes:
    """An event's hash (event_canonical_v1 in migrations/0006_log_v2.sql) from a segment line,
    whose data and tags are the stored jsonb text."""
    return audit_encoding.event_hash(prev, {**event, "data_text": event["data"], "tags_text": event["tags"]})


# --------------------------------------------------------------------------- which streams are in it


class Bloom:
    """A Bloom filter of stream ids: bit i is byte i // 8, bit i % 8 from the least
    significant (PostgreSQL's get_bit on bytea counts the same way). The k bits of
    an id are (h1 + i * h2) mod size for i < k, h1 and h2 the first two big-endian
    32-bit words of SHA-256 of the id's 16 bytes (archive_bloom_has in SQL)."""

    def __init__(self, bits: bytearray, hashes: int = BLOOM_HASHES):
        self.bits, self.hashes = bits, hashes

    @classmethod
    def sized(cls, count: int) -> "Bloom":
        size = max(64, math.ceil(count * BLOOM_BITS_PER_ID / 8) * 8)
        return cls(bytearray(size // 8))

    def positions(self, stream_id: UUID) -> list[int]:
        digest = hashlib.sha256(stream_id.bytes).digest()
        size = len(self.bits) * 8
        h1, h2 = int.from_bytes(digest[0:4], "big"), int.from_bytes(digest[4:8], "big")
        return [(h1 + i * h2) % size for i in range(self.hashes)]

    def add(self, stream_id: UUID) -> None:
        for bit in self.positions(stream_id):
            self.bits[bit // 8] |= 1 << (bit % 8)

    def __contains__(self, stream_id: UUID) -> bool:
        return all(self.bits[bit // 8] & (1 << (bit % 8)) for bit in self.positions(stream_id))


# --------------------------------------------------------------------------- writing and reading


@dataclass
class Written:
    manifest: dict[str, Any]
    path: Path
    bloom: Bloom


def line_of(row: dict[str, Any]) -> dict[str, Any]:
    """A segment line from a row of archive_partition_events."""
    return {"position": row["position"], "xid": str(row["xid"]), "stream_type": row["stream_type"],
            "stream_id": str(row["stream_id"]), "version": row["version"], "type": row["type"],
            "schema_version": row["schema_version"], "occurred_at": row["occurred_at"].isoformat(),
            "occurred_us": micros_since_2000(row["occurred_at"]), "actor": row["actor"],
            "workflow_id": str(row["workflow_id"]) if row["workflow_id"] else None,
            "tags": row["tags"], "data": row["data"], "hash": bytes(row["hash"]).hex()}


def write_segment(directory: Path, name: str, lower: int, upper: int, rows: Iterable[dict[str, Any]],
                  *, streams_hint: int = 0) -> Written:
    """Write the rows (in position order) as segment `name`, synced; return its manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    final, temporary = directory / f"{name}.jsonl.gz", directory / f".{name}.jsonl.gz.partial"
    count, raw_bytes, first, last, first_at, last_at = 0, 0, None, None, None, None
    versions: dict[str, set[int]] = {}
    streams: set[UUID] = set()
    with open(temporary, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as out:
        for row in rows:
            line = line_of(row)
            encoded = (json.dumps(line, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
            out.write(encoded)
            raw_bytes += len(encoded)
            count += 1
            first = line["position"] if first is None else first
            last = line["position"]
            first_at = first_at or line["occurred_at"]
            last_at = line["occurred_at"]
            versions.setdefault(line["type"], set()).add(line["schema_version"])
            streams.add(UUID(line["stream_id"]))
        out.close()
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(temporary, final)
    _sync_directory(directory)
    bloom = Bloom.sized(max(len(streams), streams_hint))
    for stream_id in streams:
        bloom.add(stream_id)
    manifest = {
        "format": FORMAT, "segment": name, "file": final.name,
        "partition": {"lower": lower, "upper": upper},
        "first_position": first, "last_position": last, "events": count, "streams": len(streams),
        "first_occurred_at": first_at, "last_occurred_at": last_at,
        "schema_versions": {t: sorted(v) for t, v in sorted(versions.items())},
        "sha256": file_sha256(final), "bytes": final.stat().st_size, "raw_bytes": raw_bytes,
        "bloom": {"hashes": bloom.hashes, "bits": base64.b64encode(bytes(bloom.bits)).decode()},
        "written_at": datetime.now(timezone.utc).isoformat(),
    }
    return Written(manifest, final, bloom)


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    path, temporary = directory / f"{manifest['segment']}.manifest.json", \
        directory / f".{manifest['segment']}.manifest.json.partial"
    with open(temporary, "w") as out:
        json.dump(manifest, out, indent=1, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    _sync_directory(directory)
    return path


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_segment(path: Path) -> Iterator[dict[str, Any]]:
    """The events of a segment file, in position order, as written (see line_of)."""
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            yield json.loads(line)


def manifests(directory: Path) -> list[dict[str, Any]]:
    """Every segment manifest in `directory`, in position order."""
    found = [json.loads(path.read_text()) for path in sorted(directory.glob("events-*.manifest.json"))]
    return sorted(found, key=lambda m: m["partition"]["lower"])


def bloom_of(manifest: dict[str, Any]) -> Bloom:
    return Bloom(bytearray(base64.b64decode(manifest["bloom"]["bits"])), manifest["bloom"]["hashes"])


def check_segment(directory: Path, manifest: dict[str, Any]) -> list[str]:
    """What is wrong with one segment and its manifest (empty: nothing): the file's
    checksum, and its events against what the manifest says of them."""
    path = directory / manifest["file"]
    name = manifest["segment"]
    if manifest.get("format") != FORMAT:
        return [f"{name}: unknown format {manifest.get('format')!r}"]
    if not path.exists():
        return [f"{name}: the file {path.name} is missing"]
    problems = []
    if file_sha256(path) != manifest["sha256"]:
        problems.append(f"{name}: the file's SHA-256 is not the manifest's (the file changed)")
        return problems
    lower, upper = manifest["partition"]["lower"], manifest["partition"]["upper"]
    count, previous = 0, None
    try:
        for event in read_segment(path):
            position = event["position"]
            if previous is not None and position <= previous:
                problems.append(f"{name}: position {position} follows {previous}: not in order")
            if not lower <= position < upper:
                problems.append(f"{name}: position {position} lies outside [{lower}, {upper})")
            previous = position
            count += 1
    except (OSError, EOFError, ValueError) as exc:
        return problems + [f"{name}: cannot be read back: {exc}"]
    if count != manifest["events"]:
        problems.append(f"{name}: {count} events, the manifest says {manifest['events']}")
    if count and (manifest["first_position"], manifest["last_position"]) != (_first(path), previous):
        problems.append(f"{name}: its positions are not the manifest's first and last")
    return problems


def _first(path: Path) -> int | None:
    return next((event["position"] for event in read_segment(path)), None)


@dataclass
class Digest:
    """A segment as read back: its extent, a digest of every (position, hash), and the
    events whose hash does not follow from their text."""

    events: int = 0
    first_position: int | None = None
    last_position: int | None = None
    digest: str = ""
    checked_hashes: int = 0
    hash_problems: list[str] | None = None


def digest_of(path: Path) -> Digest:
    """Read a segment back: what archive_partition_digest computes in the database, from
    the file; and every event's hash recomputed where its predecessor is known (the
    stream's first event, or the previous one in this segment)."""
    found = Digest(hash_problems=[])
    digest = hashlib.sha256()
    previous: dict[str, tuple[int, bytes]] = {}
    for event in read_segment(path):
        position, stored = event["position"], bytes.fromhex(event["hash"])
        digest.update(struct.pack(">q", position) + stored)
        found.events += 1
        found.first_position = position if found.first_position is None else found.first_position
        found.last_position = position
        before = previous.get(event["stream_id"])
        if event["version"] == 1 or (before is not None and before[0] == event["version"] - 1):
            found.checked_hashes += 1
            if event_hash(None if event["version"] == 1 else before[1], event) != stored:
                found.hash_problems.append(f"{path.name}: position {position}: its hash does not follow"
                                           " from its text as written")
        previous[event["stream_id"]] = (event["version"], stored)
    found.digest = digest.hexdigest()
    return found
