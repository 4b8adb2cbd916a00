"""`qforge pack [--close-current] [--duty SHARE] [--busy-duty SHARE] [--keep POSITIONS]`: closed partitions of the log packed in the database."""

from __future__ import annotations

import argparse

import psycopg

from qforge.cli.common import complain, run_batch_job
from qforge.log.pack import PackError, pack


def run(args: argparse.Namespace) -> int:
    """Exit 0: done (or nothing to pack); 2: could not run."""
    if args.keep < 0:
        complain("pack", f"--keep is a number of positions, >= 0, not {args.keep}")
        return 2
    done = run_batch_job("pack", args, (PackError, psycopg.Error, ValueError), lambda conn, progress: pack(
        conn, close_current=args.close_current, duty=args.duty, busy_duty=args.busy_duty, keep=args.keep,
        report=lambda line: print(line, flush=True), progress=progress))
    if done is None:
        return 2
    if not done.partitions:
        print("nothing to pack: no closed partition (--close-current closes the one being written)")
        return 0
    rate = done.events / done.seconds if done.seconds else 0
    print(f"packed {len(done.partitions)} partition(s), {done.events:,} events in {done.seconds:.1f} s"
          f" ({rate:,.0f} events/s; {done.rested:.1f} s of it resting, {done.busy_rests} rests with the queue busy)")
    return 0
