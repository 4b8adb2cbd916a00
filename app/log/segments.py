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
import binascii
import gzip
import hashlib
import json
import math
import os
import re
import struct
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator
from uuid import UUID

from qforge.tools import verify_audit_proof as audit_encoding

FORMAT = "qforge-archive-segment-v1"
# Bits set per stream id, and bits per id: about one false positive in 10,000
# lookups per segment, so an unknown id is almost never taken for an archived one.
BLOOM_HASHES = 13
BLOOM_BITS_PER_ID = 19.2


def segment_name(lower: int, upper: int) -> str:
    return f"events-{lower:019d}-{upper:019d}"


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


# A segment line as the database writes it (archive_partition_lines): these
# fields first and last, in this order, so that the writer and the read-back
# take them with one match instead of parsing the line.
LINE_HEAD = re.compile(rb'^\{"position" : (\d+), "xid" : "\d+", "stream_type" : "[^"]*", '
                       rb'"stream_id" : "([0-9a-f-]{36})", "version" : (\d+),')
LINE_TAIL = re.compile(rb'"hash" : "([0-9a-f]{64})"\}$')
TAIL_BYTES = len(b'"hash" : "') + 64 + len(b'"}')  # matched where it must start, not searched for
# Events whose hash the writer's read-back recomputes: every stream's first
# event (its hash needs nothing before it), one in HASH_SAMPLE of them.
HASH_SAMPLE = 64
REST_LINES = 50_000  # digest_of: lines read between two calls of `rest`
COMPRESS_LEVEL = 3  # zlib: most of level 6's ratio at about twice its speed
WRITE_LINES = 1_000


def _fields(line: bytes) -> tuple[int, str, int, bytes]:
    """(position, stream_id, version, hash) of a line: matched in the database's layout,
    else parsed (any JSON object with those fields is a line)."""
    head, tail = LINE_HEAD.match(line), LINE_TAIL.match(line, len(line) - TAIL_BYTES)
    if head is not None and tail is not None:
        return int(head.group(1)), head.group(2).decode(), int(head.group(3)), binascii.unhexlify(tail.group(1))
    event = json.loads(line)
    return int(event["position"]), str(event["stream_id"]), int(event["version"]), bytes.fromhex(event["hash"])


def write_segment(directory: Path, name: str, lower: int, upper: int, lines: Iterable[bytes],
                  summary: dict[str, Any]) -> tuple[Written, "Digest"]:
    """Write the lines (JSON objects in position order, from the database) as segment `name`,
    synced; return its manifest and the digest of what was written. `summary`: the
    partition's count, time range and schema versions per type (archive_partition_summary)."""
    directory.mkdir(parents=True, exist_ok=True)
    final, temporary = directory / f"{name}.jsonl.gz", directory / f".{name}.jsonl.gz.partial"
    streams: set[str] = set()
    digest, written = hashlib.sha256(), Digest()
    pack = struct.Struct(">q").pack
    with open(temporary, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=COMPRESS_LEVEL,
                                                    mtime=0) as out:
        batch: list[bytes] = []  # lines go to the compressor WRITE_LINES at a time: a write costs more than a line
        for line in lines:
            position, stream_id, _version, stored = _fields(line)
            batch.append(line)
            written.raw_bytes += len(line) + 1
            digest.update(pack(position) + stored)
            streams.add(stream_id)
            written.events += 1
            written.first_position = position if written.first_position is None else written.first_position
            written.last_position = position
            if len(batch) == WRITE_LINES:
                out.write(b"\n".join(batch) + b"\n")
                batch.clear()
        if batch:
            out.write(b"\n".join(batch) + b"\n")
        out.close()
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(temporary, final)
    _sync_directory(directory)
    written.digest = digest.hexdigest()
    bloom = Bloom.sized(len(streams))
    for stream_id in streams:
        bloom.add(UUID(stream_id))
    manifest = {
        "format": FORMAT, "segment": name, "file": final.name,
        "partition": {"lower": lower, "upper": upper},
        "first_position": written.first_position, "last_position": written.last_position,
        "events": written.events, "streams": len(streams),
        "first_occurred_at": summary["first_occurred_at"], "last_occurred_at": summary["last_occurred_at"],
        "schema_versions": summary["schema_versions"],
        "sha256": file_sha256(final), "bytes": final.stat().st_size, "raw_bytes": written.raw_bytes,
        "bloom": {"hashes": bloom.hashes, "bits": base64.b64encode(bytes(bloom.bits)).decode()},
        "written_at": datetime.now(timezone.utc).isoformat(),
    }
    return Written(manifest, final, bloom), written


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
    """The events of a segment file, in position order, as written (lines of archive_partition_lines)."""
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            yield json.loads(line)


def manifests(directory: Path) -> list[dict[str, Any]]:
    """Every segment manifest in `directory`, in position order."""
    found = [json.loads(path.read_text()) for path in sorted(directory.glob("events-*.manifest.json"))]
    return sorted(found, key=lambda m: m["partition"]["lower"])


def bloom_of(manifest: dict[str, Any]) -> Bloom:
    return Bloom(bytearray(base64.b64decode(manifest["bloom"]["bits"])), manifest["bloom"]["hashes"])


def check_segment(directory: Path, manifest: dict[str, Any], *, read: bool = True) -> list[str]:
    """What is wrong with one segment and its manifest (empty: nothing): the file's
    checksum and (`read`) its events' positions against what the manifest says."""
    path = directory / manifest["file"]
    name = manifest["segment"]
    if manifest.get("format") != FORMAT:
        return [f"{name}: unknown format {manifest.get('format')!r}"]
    if not path.exists():
        return [f"{name}: the file {path.name} is missing"]
    if file_sha256(path) != manifest["sha256"]:
        return [f"{name}: the file's SHA-256 is not the manifest's (the file changed)"]
    if not read:
        return []
    problems = []
    lower, upper = manifest["partition"]["lower"], manifest["partition"]["upper"]
    count, first, previous = 0, None, None
    try:
        with gzip.open(path, "rb") as lines:
            for line in lines:
                position = _fields(line.rstrip(b"\n"))[0]
                if previous is not None and position <= previous:
                    problems.append(f"{name}: position {position} follows {previous}: not in order")
                if not lower <= position < upper:
                    problems.append(f"{name}: position {position} lies outside [{lower}, {upper})")
                first = position if first is None else first
                previous = position
                count += 1
    except (OSError, EOFError, ValueError) as exc:
        return problems + [f"{name}: cannot be read back: {exc}"]
    if count != manifest["events"]:
        problems.append(f"{name}: {count} events, the manifest says {manifest['events']}")
    if count and (manifest["first_position"], manifest["last_position"]) != (first, previous):
        problems.append(f"{name}: its positions are not the manifest's first and last")
    return problems


@dataclass
class Digest:
    """A segment as read back: its extent, a digest of every (position, hash), and the
    events whose hash does not follow from their text."""

    events: int = 0
    first_position: int | None = None
    last_position: int | None = None
    digest: str = ""
    raw_bytes: int = 0
    checked_hashes: int = 0
    hash_problems: list[str] | None = None


def digest_of(path: Path, *, full: bool = True, rest: Callable[[], None] | None = None) -> Digest:
    """Read a segment back: the digest archive wrote of every (position, hash), from the
    file; and the hash of every event recomputed where its predecessor is known (the
    stream's first event, or the previous one in this segment) — or, not `full`, of a
    sample of the streams' first events (the writer's quick read-back). `rest`, when
    given, is called every REST_LINES lines (the archive's Pace)."""
    found = Digest(hash_problems=[])
    digest = hashlib.sha256()
    previous: dict[str, tuple[int, bytes]] = {}
    firsts = 0
    with gzip.open(path, "rb") as lines:
        for line in lines:
            line = line.rstrip(b"\n")
            position, stream_id, version, stored = _fields(line)
            digest.update(struct.pack(">q", position) + stored)
            found.events += 1
            found.first_position = position if found.first_position is None else found.first_position
            found.last_position = position
            if rest is not None and found.events % REST_LINES == 0:
                rest()
            if full:
                before = previous.get(stream_id)
                check = version == 1 or (before is not None and before[0] == version - 1)
                previous[stream_id] = (version, stored)
            else:
                firsts += version == 1
                check, before = version == 1 and firsts % HASH_SAMPLE == 1, None
            if check:
                found.checked_hashes += 1
                if event_hash(None if version == 1 else before[1], json.loads(line)) != stored:
                    found.hash_problems.append(f"{path.name}: position {position}: its hash does not follow"
                                               " from its text as written")
    found.digest = digest.hexdigest()
    return found
