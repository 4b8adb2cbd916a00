"""`qforge history ID [--archive DIR]`: an execution's events, oldest first, one JSON object a line.

The archive's part comes from the segments whose Bloom filter has the id (a
workflow brings its steps' events, as GET /workflows/{id}/events does), the
rest from the live log; a partition archived but not yet dropped is in both and
printed once.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

from qforge.cli.common import complain, database_url
from qforge.db import connect
from qforge.events import store
from qforge.log import segments
from qforge.events.types import Event, expand
from qforge.log.archived import segments_holding


def archived_events(directory: Path, execution: UUID) -> list[Event]:
    """The events of `execution` (a workflow: with its steps') in the segments of `directory`."""
    found, tags = [], {}
    for manifest in segments.manifests(directory):
        if execution not in segments.bloom_of(manifest):
            continue
        for line in segments.read_segment(directory / manifest["file"]):
            if line["stream_id"] != str(execution) and line["workflow_id"] != str(execution):
                continue
            if line["tags"] is not None:
                tags[line["stream_id"]] = json.loads(line["tags"])
            found.append(line)
    return [_event(line, tags.get(line["stream_id"], {})) for line in found]


def _event(line: dict[str, Any], tags: dict[str, str]) -> Event:
    occurred_at = datetime.fromisoformat(line["occurred_at"])
    return Event(position=line["position"], stream_type=line["stream_type"], stream_id=line["stream_id"],
                 version=line["version"], type=line["type"], schema_version=line["schema_version"],
                 data=expand(line["type"], line["schema_version"], json.loads(line["data"]), line["actor"],
                             occurred_at),
                 tags=tags, workflow_id=line["workflow_id"], occurred_at=occurred_at, actor=line["actor"],
                 xid=int(line["xid"]))


def run(args: argparse.Namespace) -> int:
    """Exit 0: printed; 1: no such execution (or only in an archive not given); 2: could not run."""
    try:
        execution = UUID(args.id)
    except ValueError:
        complain("history", f"{args.id!r} is not an id")
        return 2
    if args.archive is not None and not args.archive.is_dir():
        complain("history", f"{args.archive} is not a directory")
        return 2
    url = database_url("history", getattr(args, "database_url", None))
    if url is None:
        return 2
    events = archived_events(args.archive, execution) if args.archive is not None else []
    try:
        with connect(url, autocommit=True) as conn:
            live = store.read_workflow(conn, execution)
            if not live:
                live = store.read_stream(conn, execution)
            held = segments_holding(conn, execution) if args.archive is None else []
    except psycopg.Error as exc:
        complain("history", exc)
        return 2
    seen = {e.position for e in events}
    events += [e for e in live if e.position not in seen]
    events.sort(key=lambda e: e.position)
    for event in events:
        print(json.dumps(event.model_dump(mode="json")))
    if held:
        complain("history", f"{execution} has events in archive segment(s) "
                 f"{', '.join(h['segment'] for h in held)}: pass --archive DIR to read them")
        return 1 if not events else 0
    if not events:
        complain("history", f"no events of {execution}" + (f" in {args.archive} or" if args.archive else " in")
                 + " the live log")
        return 1
    return 0
