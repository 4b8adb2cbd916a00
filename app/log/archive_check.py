"""`qforge archive verify DIR`: every segment whole and as its manifest says, and segments plus live log one unbroken range of positions."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from psycopg.rows import dict_row

from qforge.log import segments
from qforge.sql import q

LOG_START = 1  # the first position of the log (its sequence starts there)


@dataclass
class ArchiveReport:
    problems: list[str] = field(default_factory=list)
    segments: int = 0
    events: int = 0
    lower: int = LOG_START
    upper: int = LOG_START  # positions [lower, upper) are in segments
    live_lower: int | None = None  # where the live log starts (with a database)


def verify_archive(directory: Path, conn=None) -> ArchiveReport:
    """Check every manifest and segment of `directory`, that the segments tile the positions
    from the log's start without gap or overlap, and (with `conn`) that they are the
    segments the database recorded and that the live log starts where they end."""
    report = ArchiveReport()
    found = segments.manifests(directory)
    expected_lower = LOG_START
    for manifest in found:
        name = manifest.get("segment", "?")
        problems = segments.check_segment(directory, manifest)
        if not problems:
            read = segments.digest_of(directory / manifest["file"])
            problems = read.hash_problems or []
            report.events += read.events
        report.problems.extend(problems)
        lower, upper = manifest["partition"]["lower"], manifest["partition"]["upper"]
        if lower > expected_lower:
            report.problems.append(f"gap: positions [{expected_lower}, {lower}) are in no segment (before {name})")
        elif lower < expected_lower:
            report.problems.append(f"overlap: {name} starts at {lower}, the segments before it end at {expected_lower}")
        expected_lower = max(expected_lower, upper)
        report.segments += 1
    report.upper = expected_lower
    if conn is not None:
        _against_database(conn, found, report)
    return report


def _against_database(conn, found: list[dict], report: ArchiveReport) -> None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("archive_segments_recorded"))
        recorded = {row["segment"]: row for row in cur.fetchall()}
        cur.execute(q("archive_live_start"))
        report.live_lower = cur.fetchone()["lower"]
    on_disk = {m["segment"]: m for m in found}
    for name, row in recorded.items():
        manifest = on_disk.get(name)
        if manifest is None:
            report.problems.append(f"{name}: recorded by the database ({row['state']}) but not in the directory")
        elif manifest["sha256"] != row["sha256"]:
            report.problems.append(f"{name}: its SHA-256 is not the one the database recorded when it was archived")
    for name in on_disk.keys() - recorded.keys():
        report.problems.append(f"{name}: in the directory but not recorded by this database (another log's?)")
    if report.live_lower is not None and recorded and report.live_lower != report.upper:
        if report.live_lower > report.upper:
            report.problems.append(f"gap: positions [{report.upper}, {report.live_lower}) are neither in a segment"
                                   " nor in the live log")
        elif any(row["state"] == "dropped" for row in recorded.values() if row["upper_position"] > report.live_lower):
            report.problems.append(f"the live log starts at {report.live_lower}, inside the archived range"
                                   f" (which ends at {report.upper})")
