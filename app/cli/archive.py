"""`qforge archive [--older-than D] [--to DIR] [--close-current]` and `qforge archive verify DIR`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import psycopg

from qforge.cli.common import complain, database_url, run_batch_job
from qforge.db import connect
from qforge.log.archive import ArchiveError, archive
from qforge.log.archive_check import verify_archive
from qforge.settings import get_settings


def run(args: argparse.Namespace) -> int:
    """Exit 0: done (verify: the archive is sound); 1: verify found problems; 2: could not run."""
    if args.action == "verify":
        return _verify(args)
    if args.directory is not None:
        complain("archive", f"unexpected argument {args.directory} (did you mean --to {args.directory}?)")
        return 2
    directory = args.to or get_settings().archive_dir
    if directory is None:
        complain("archive", "where to? give --to DIR or set QFORGE_ARCHIVE_DIR")
        return 2
    done = run_batch_job("archive", args, (ArchiveError, psycopg.Error, OSError, ValueError),
                         lambda conn, progress: archive(
                             conn, Path(directory), older_than=args.older_than, close_current=args.close_current,
                             report=lambda line: print(line, flush=True), duty=args.duty,
                             busy_duty=args.busy_duty, progress=progress))
    if done is None:
        return 2
    if not done.segments:
        print("nothing to archive: no closed partition" + (" old enough" if args.older_than else "")
              + " (--close-current closes the one being written)")
        return 0
    raw = sum(m["raw_bytes"] for m in done.segments)
    packed = sum(m["bytes"] for m in done.segments)
    rate = done.events / done.seconds if done.seconds else 0
    print(f"archived {len(done.segments)} segment(s), {done.events:,} events to {directory} in"
          f" {done.seconds:.1f} s ({rate:,.0f} events/s; {raw:,} bytes -> {packed:,} compressed);"
          f" the read model let go of {done.jobs_released:,} jobs and {done.workflows_released:,} workflows;"
          f" {done.rested:.1f} s of it resting ({done.busy_rests} of {done.rests} rests with the queue busy)")
    return 0


def _verify(args: argparse.Namespace) -> int:
    if args.directory is None:
        complain("archive", "verify needs the archive directory: qforge archive verify DIR")
        return 2
    if not args.directory.is_dir():
        complain("archive", f"{args.directory} is not a directory")
        return 2
    url = None
    if getattr(args, "database_url", None) or get_settings().database_url:
        url = database_url("archive", getattr(args, "database_url", None))
    try:
        if url is None:
            report = verify_archive(args.directory, None)
        else:
            with connect(url, autocommit=True) as conn:
                report = verify_archive(args.directory, conn)
    except psycopg.Error as exc:
        complain("archive", exc)
        return 2
    for problem in report.problems:
        print(problem)
    summary = (f"{report.segments} segment(s), {report.events:,} events, positions"
               f" [{report.lower}, {report.upper})" + ("" if url is None else
                                                        f"; live log from {report.live_lower}"))
    if report.problems:
        print(f"{len(report.problems)} problem(s); {summary}", file=sys.stderr)
        return 1
    print(f"archive sound: {summary}")
    return 0
