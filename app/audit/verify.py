"""`qforge audit verify`: every stream's hash chain, every checkpoint, and the log against the checkpoints.

Three kinds of evidence, each catching what the others cannot:
- the chains: each event's hash against its own bytes and the hash before it
  in its stream (an edit, a deletion from the middle, a duplicate version);
- the checkpoints: each one's Merkle root and hash recomputed and chained to
  the previous one, then every event they cover compared with the leaf they
  recorded for its position (a stream rewritten with a self-consistent chain,
  an event inserted or moved, the newest events deleted);
- anchors: heads exported earlier (`qforge audit head`, or every head a
  witness directory holds), which the chain of checkpoints must still reach
  and agree with (the newest events deleted with their checkpoints; events,
  chains and checkpoints rewritten together).
Everything is read in one REPEATABLE READ snapshot, so it may run while the
system works.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping
from uuid import UUID

from psycopg.rows import dict_row

from qforge.log import segments
from qforge.audit import checkpoints as audit
from qforge.sql import q
from qforge.tools import verify_audit_proof as tool


@dataclass(frozen=True, order=True)
class Problem:
    """One thing that does not hold, at the position of the first event it concerns."""

    position: int
    message: str
    stream_id: UUID | None = None

    def describe(self) -> str:
        stream = f" stream={self.stream_id}" if self.stream_id else ""
        return f"position={self.position}{stream}: {self.message}"


@dataclass
class VerifyReport:
    problems: list[Problem] = field(default_factory=list)
    events: int = 0  # live events checked
    archived_events: int = 0
    checkpoints: int = 0
    newest_checkpoint: int | None = None
    anchor_seq: int | None = None  # the newest anchor's checkpoint
    anchors: int = 0
    unchecked_below: int = 0  # archived positions below this were not checked (no --archive)
    seconds: float = 0.0

    @property
    def holds(self) -> bool:
        return not self.problems

    @property
    def events_per_second(self) -> float:
        return (self.events + self.archived_events) / self.seconds if self.seconds > 0 else 0.0


class AnchorError(ValueError):
    """The anchor file is not a head, or its signature does not hold: nothing to verify against."""


def read_anchor(text: str, public_key: str | None = None) -> dict[str, Any]:
    """The head in an anchor file's text (its last non-empty line), its signature checked."""
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        anchor = json.loads(lines[-1]) if lines else None
    except ValueError:
        anchor = None
    if not isinstance(anchor, dict) or not {"seq", "hash"} <= anchor.keys():
        raise AnchorError("the anchor is not a head line of `qforge audit head`")
    try:
        fields_hold = tool.header_hash(anchor).hex() == anchor["hash"]
    except (KeyError, ValueError, TypeError):
        fields_hold = False
    if not fields_hold:
        raise AnchorError("the anchor's fields do not give its hash: it was edited")
    problem = audit.verify_head_signature(anchor, public_key)
    if problem:
        raise AnchorError(problem)
    return anchor


@dataclass
class _ArchivedLeaves:
    """The archive's events as the checks need them: chain heads per stream, and (position, hash)."""

    heads: dict[UUID, tuple[int, bytes]] = field(default_factory=dict)
    positions: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    stream_ids: list[UUID] = field(default_factory=list)


def _check_archive(events: Iterable[Mapping[str, Any]], problems: list[Problem]) -> _ArchivedLeaves:
    """Chain-check archived events (in position order, each with its stored columns and hash)."""
    leaves = _ArchivedLeaves()
    for event in events:
        stream_id = UUID(str(event["stream_id"]))
        stored = bytes.fromhex(event["hash"]) if isinstance(event["hash"], str) else bytes(event["hash"])
        version, prev = leaves.heads.get(stream_id, (0, None))
        if event["version"] != version + 1:
            problems.append(Problem(event["position"], f"archived: version {event['version']} follows"
                                                       f" version {version} of its stream", stream_id))
        if audit.event_hash(prev, event) != stored:
            problems.append(Problem(event["position"], "archived: the event's hash does not match its"
                                                       " contents and the hash before it", stream_id))
        leaves.heads[stream_id] = (event["version"], stored)
        leaves.positions.append(event["position"])
        leaves.hashes.append(stored)
        leaves.stream_ids.append(stream_id)
    return leaves


def _check_chains(cur, archived: _ArchivedLeaves, archive_unread: bool, problems: list[Problem]) -> None:
    ids = list(archived.heads)
    cur.execute(q("audit_chain_breaks"), {
        "archive_unread": archive_unread,
        "archived_ids": ids, "archived_versions": [archived.heads[i][0] for i in ids],
        "archived_hashes": [archived.heads[i][1] for i in ids]})
    for row in cur.fetchall():
        if row["version"] != row["prev_version"] + 1:
            if row["version"] <= row["prev_version"]:
                what = f"version {row['version']} appears again (an event was inserted)"
            else:
                missing = (f"version {row['prev_version'] + 1}" if row["version"] == row["prev_version"] + 2
                           else f"versions {row['prev_version'] + 1}-{row['version'] - 1}")
                what = f"{missing} of the stream is missing: the chain jumps to version {row['version']}"
            problems.append(Problem(row["position"], what, row["stream_id"]))
        if not row["hash_holds"]:
            problems.append(Problem(row["position"], f"version {row['version']}: the stored hash does not"
                                                     " match the event's contents and the hash before it",
                                    row["stream_id"]))
        if not row["head_holds"]:
            problems.append(Problem(row["row_position"] or row["position"],
                                    f"the stream's row chains to the event at position {row['row_position']},"
                                    f" but its last event is at position {row['position']} with another hash"
                                    " (its newest events were deleted or changed)", row["stream_id"]))


def _check_checkpoint_chain(conn, problems: list[Problem], moved: Callable[[int], None] = lambda _n: None
                            ) -> tuple[dict[int, bytes], dict[int, int]]:
    """Recompute every checkpoint from its leaves; returns seq -> hash and seq -> first position.
    `moved(n)` hears of the n events of every checkpoint walked."""
    hashes: dict[int, bytes] = {}
    firsts: dict[int, int] = {}
    previous: audit.Checkpoint | None = None
    # A named cursor: the leaves of every checkpoint are read a batch at a time.
    with conn.cursor(name="audit_checkpoints_walk", row_factory=dict_row) as cur:
        cur.itersize = 50
        cur.execute(q("audit_checkpoint_headers"), {"leaves": True, "from_seq": 0})
        for row in cur:
            point = audit.Checkpoint.from_row(row)
            positions, leaf_hashes = row["positions"], bytes(row["hashes"])
            first = min(positions) if positions else point.cursor_position
            hashes[point.seq], firsts[point.seq] = point.hash, first
            expected_seq = previous.seq + 1 if previous else 1
            if point.seq != expected_seq:
                problems.append(Problem(first, f"checkpoints {expected_seq}-{point.seq - 1} are missing"
                                               f" (the chain goes on at checkpoint {point.seq})"))
            elif point.prev != (previous.hash if previous else None):
                problems.append(Problem(first, f"checkpoint {point.seq} does not chain to the checkpoint"
                                               " before it"))
            if (len(positions) != point.events or len(leaf_hashes) != audit.HASH_BYTES * point.events
                    or not positions or positions[-1] != point.cursor_position):
                problems.append(Problem(first, f"checkpoint {point.seq}: its leaves do not match its"
                                               " event count and cursor"))
            elif audit.merkle_root(audit.leaves_of(positions, leaf_hashes)) != point.root:
                problems.append(Problem(first, f"checkpoint {point.seq}: its leaves do not give its Merkle root"))
            if point.recomputed_hash() != point.hash:
                problems.append(Problem(first, f"checkpoint {point.seq}: its hash does not match its header"))
            previous = point
            moved(point.events)
    return hashes, firsts


def _check_against_checkpoints(cur, archived: _ArchivedLeaves, unchecked_below: int,
                               problems: list[Problem]) -> None:
    cur.execute(q("audit_checkpoint_diff"), {
        "unchecked_below": unchecked_below,
        "archived_positions": archived.positions, "archived_hashes": archived.hashes,
        "archived_ids": archived.stream_ids})
    for row in cur.fetchall():
        if row["present"] is None:
            what = f"the event checkpoint {row['seq']} recorded here is gone"
        elif row["recorded"] is None:
            what = ("no checkpoint recorded an event here, yet it sorts before the newest checkpoint's"
                    " cursor: it was inserted (or moved)")
        else:
            what = f"the event's hash differs from the one checkpoint {row['seq']} recorded"
        problems.append(Problem(row["position"], what, row["stream_id"]))


def _check_anchor(anchor: Mapping[str, Any], hashes: dict[int, bytes], firsts: dict[int, int],
                  problems: list[Problem]) -> None:
    seq = int(anchor["seq"])
    first = anchor.get("first_position") or anchor.get("cursor_position") or 0
    if seq not in hashes:
        newest = max(hashes, default=0)
        problems.append(Problem(first, f"the anchor's checkpoint {seq} is not in the database (its"
                                       f" checkpoints end at {newest or 'none'}): the events it covered,"
                                       f" from position {first}, were deleted with their checkpoints"))
    elif hashes[seq].hex() != anchor["hash"]:
        problems.append(Problem(firsts.get(seq, first), f"checkpoint {seq} differs from the anchor's: the"
                                                        " checkpoints were rewritten"))


def segment_events(directory: Path, problems: list[Problem]) -> Iterator[dict[str, Any]]:
    """The events of an archive directory's segments, in position order, in the shape the checks
    read (data and tags as the jsonb text the hash covers); what is wrong with a segment file
    itself (its checksum, its manifest) goes to `problems`."""
    for manifest in segments.manifests(Path(directory)):
        lower = manifest.get("partition", {}).get("lower", 0)
        broken = segments.check_segment(Path(directory), manifest)
        problems.extend(Problem(lower, f"archive: {line}") for line in broken)
        if broken:
            continue
        for line in segments.read_segment(Path(directory) / manifest["file"]):
            yield {**line, "data_text": line["data"], "tags_text": line["tags"]}


def verify(conn, *, anchor: Mapping[str, Any] | None = None, anchors: Iterable[Mapping[str, Any]] = (),
           archive: Path | None = None,
           progress: Callable[[int, int | None], None] | None = None) -> VerifyReport:
    """Check the log against `anchor` and `anchors` (heads kept outside the database), and the
    segments of the archive directory `archive` if given; problems sorted by position. Without the
    archive, archived events are left unchecked (`report.unchecked_below`).
    `progress(done, total)` counts events through the three passes: the hash chains (one
    statement: counted when it ends), the walk of the checkpoints (checkpoint by checkpoint) and
    the comparison with them (one statement)."""
    anchors = [*([anchor] if anchor is not None else []), *anchors]
    started = time.perf_counter()
    report = VerifyReport()
    problems: list[Problem] = []
    tally = {"done": 0, "total": None}

    def moved(count: int) -> None:
        tally["done"] += count
        if progress is not None and count:
            progress(tally["done"], tally["total"])
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(q("log_read_lock"))
            extent = cur.execute(q("audit_archive_extent")).fetchone()
            # Segments still attached are read from the live log, not twice.
            events = (e for e in segment_events(archive, problems) if e["position"] < extent["live_lower"]) \
                if archive is not None else ()
            archived = _check_archive(events, problems)
            report.archived_events = len(archived.positions)
            report.unchecked_below = 0 if archive is not None else extent["archived_upper"]
            report.events = cur.execute(q("audit_events_count")).fetchone()["n"]
            checkpointed = cur.execute(q("audit_checkpointed_events")).fetchone()["n"]
            tally["total"] = 2 * report.events + checkpointed
            _check_chains(cur, archived, archive is None and extent["archived_upper"] > 0, problems)
            moved(report.events)
            hashes, firsts = _check_checkpoint_chain(conn, problems, moved)
            _check_against_checkpoints(cur, archived, report.unchecked_below, problems)
            moved(report.events)
    for each in anchors:
        _check_anchor(each, hashes, firsts, problems)
    report.anchors = len(anchors)
    report.anchor_seq = max((int(each["seq"]) for each in anchors), default=None)
    report.checkpoints = len(hashes)
    report.newest_checkpoint = max(hashes, default=None)
    report.problems = sorted(set(problems), key=lambda p: (p.position, p.message))
    report.seconds = time.perf_counter() - started
    return report
