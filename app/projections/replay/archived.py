"""Replay across the archive: the segments' events are folded first, then the live log, then the read model lets go of what the archive holds whole.

The database records which segments left it (archive_segments); a replay that
is not given the archive directory while some did refuses and names them,
because folding the live log alone would rebuild the executions whose first
events left with the archive wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg import sql
from psycopg.rows import dict_row

from qforge.log import segments
from qforge.events.states import JOB_FINISHED, WORKFLOW_FINISHED
from qforge.projections.replay.common import ReplayError, template
from qforge.sql import q

ARCHIVE_TABLE = "archived_events"
_COPY_COLUMNS = ("position", "xid", "stream_type", "stream_id", "version", "type", "schema_version", "data",
                 "tags", "workflow_id", "occurred_at", "actor", "hash")


@dataclass(frozen=True)
class ArchiveFeed:
    """The archive's events, loaded into `table` for the fold."""

    table: sql.Identifier
    before: int  # positions below are the archive's; the live log is folded from here
    events: int


def recorded_segments(cur) -> list[dict[str, Any]]:
    cur.execute(q("archive_segments_recorded"))
    return cur.fetchall()


def load_archive(cur, directory: Path | None, schema: str | None, live: str) -> ArchiveFeed | None:
    """Load the segments the database recorded from `directory` into an archive table of
    `schema` (None: a temporary one); None when nothing was ever archived. ReplayError
    when segments are recorded and `directory` lacks them (or was not given)."""
    recorded = recorded_segments(cur)
    if not recorded:
        return None
    before = max(row["upper_position"] for row in recorded)
    names = ", ".join(row["segment"] for row in recorded)
    if directory is None:
        raise ReplayError(f"the log before position {before} is archived, in {len(recorded)} segment(s)"
                          f" ({names}): pass --archive DIR with the archive directory to fold them")
    on_disk = {m["segment"]: m for m in segments.manifests(Path(directory))}
    problems = []
    for row in recorded:
        manifest = on_disk.get(row["segment"])
        if manifest is None:
            problems.append(f"{row['segment']} is not in {directory}")
        elif manifest["sha256"] != row["sha256"]:
            problems.append(f"{row['segment']} in {directory} is not the segment that was archived (SHA-256)")
        else:
            problems.extend(segments.check_segment(Path(directory), manifest))
    if problems:
        raise ReplayError("the archive cannot be folded: " + "; ".join(problems))
    events = sql.Identifier(live, "events")
    if schema is None:
        table = sql.Identifier(ARCHIVE_TABLE)
        cur.execute(template("replay_archive_temp_table", table=table, events=events))
        table = sql.Identifier("pg_temp", ARCHIVE_TABLE)
    else:
        table = sql.Identifier(schema, ARCHIVE_TABLE)
        cur.execute(template("replay_archive_table", table=table, events=events))
    loaded = 0
    with cur.copy(template("replay_archive_copy", table=table)) as copy:
        for row in recorded:
            manifest = on_disk[row["segment"]]
            for line in segments.read_segment(Path(directory) / manifest["file"]):
                copy.write_row([line[c] if c != "hash" else bytes.fromhex(line[c]) for c in _COPY_COLUMNS])
                loaded += 1
    cur.execute(template("replay_archive_index", table=table))
    return ArchiveFeed(table, before, loaded)


def archive_table(cur, schema: str) -> sql.Identifier | None:
    """The archive table a rebuild in `schema` loaded, if any (swap folds from it too)."""
    table = sql.Identifier(schema, ARCHIVE_TABLE)
    cur.execute(q("replay_archive_exists"), {"table": table.as_string(cur)})
    return table if cur.fetchone()["present"] else None


def archive_extent(cur, table: sql.Composable, as_of: int | None) -> dict[str, Any]:
    with cur.connection.cursor(row_factory=dict_row) as own:
        own.execute(template("replay_archive_extent", table=table), {"as_of": as_of}, prepare=False)
        return own.fetchone()


def release(cur, before: int) -> None:
    """What the live path did when the segments were archived (archive_release), on the
    tables first on the search path: the scratch ones, after a fold."""
    cur.execute(q("archive_release"), {"before": before, "job_done": sorted(JOB_FINISHED),
                                       "workflow_done": sorted(WORKFLOW_FINISHED)})
