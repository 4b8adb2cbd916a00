"""`qforge audit checkpoint | head | verify [--anchor FILE] [--archive DIR] | export ID`: the tamper-evident log."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from uuid import UUID

import psycopg

from qforge.cli.common import complain
from qforge.db import EmbeddedPostgresError, connect, resolve_database_url
from qforge.audit import checkpoints as audit
from qforge.audit import proofs as audit_proof
from qforge.audit import witness
from qforge.cli.progress import Progress
from qforge.audit.verify import AnchorError, read_anchor, verify
from qforge.settings import get_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # --database-url is accepted after the action too; SUPPRESS keeps a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--database-url", default=argparse.SUPPRESS, help="PostgreSQL URL")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help: str) -> argparse.ArgumentParser:
        return actions.add_parser(name, help=help, description=help, parents=[common])

    action("checkpoint", "record a checkpoint over the events no checkpoint covers yet")
    action("head", "print the newest checkpoint as one JSON line (signed with"
                   " QFORGE_AUDIT_SIGNING_KEY when set), to keep outside the database")
    check = action("verify", "recompute every hash chain and checkpoint; exit 1 on any problem,"
                             " one line with position=<N> each")
    check.add_argument("--anchor", type=Path, default=None, metavar="FILE",
                       help="a head printed by `qforge audit head` earlier: the checkpoints must still reach it")
    check.add_argument("--witness", type=Path, default=None, metavar="DIR",
                       help="a witness directory (QFORGE_AUDIT_WITNESS_DIR): the log must extend every head in it")
    check.add_argument("--archive", type=Path, default=None, metavar="DIR",
                       help="archive segments whose events are verified with the live log")
    check.add_argument("--public-key", default=None, metavar="HEX",
                       help="the Ed25519 public key that signs your heads (default: QFORGE_AUDIT_SIGNING_KEY's)")
    export = action("export", "print the proof of a job or workflow (its events, their hashes,"
                              " the checkpoints covering them) as JSON")
    export.add_argument("id", type=UUID, metavar="ID", help="a job or workflow id")
    export.add_argument("--archive", type=Path, default=None, metavar="DIR",
                        help="archive segments holding the first events of its streams (default QFORGE_ARCHIVE_DIR)")


def run(args: argparse.Namespace) -> int:
    """Exit 0: done (verify: everything holds); 1: verify found problems, export found nothing; 2: could not run."""
    try:
        url = resolve_database_url(getattr(args, "database_url", None))
        with connect(url, autocommit=True) as conn:
            return ACTIONS[args.action](conn, args)
    except (EmbeddedPostgresError, psycopg.Error, audit.SigningKeyError, AnchorError, OSError) as exc:
        complain("audit", exc)
        return 2


def _checkpoint(conn, args: argparse.Namespace) -> int:
    made = audit.checkpoint(conn)
    if not made:
        print("nothing new to checkpoint")
        return 0
    events = sum(c.events for c in made)
    print(f"checkpoint {made[-1].seq}: {events} new events up to position {made[-1].cursor_position}"
          f" (hash {made[-1].hash.hex()})")
    return 0


def _head(conn, args: argparse.Namespace) -> int:
    line = audit.head(conn, signing_key=get_settings().audit_signing_key)
    if line is None:
        complain("audit", "no checkpoint yet (`qforge audit checkpoint` makes one)")
        return 1
    print(audit.head_line(line))
    return 0


def _public_key(args: argparse.Namespace) -> str | None:
    if args.public_key:
        return args.public_key
    signing_key = get_settings().audit_signing_key
    return audit.public_key_hex(audit.load_signing_key(signing_key)) if signing_key else None


def _witnessed(directory: Path, public_key: str | None) -> list[dict]:
    """Every head in a witness directory, each checked as an anchor is (naming the file it is in)."""
    heads = []
    for path in witness.head_files(directory):
        try:
            heads.append(read_anchor(path.read_text(encoding="utf-8"), public_key))
        except AnchorError as exc:
            raise AnchorError(f"{path}: {exc}") from None
    return heads


def _verify(conn, args: argparse.Namespace) -> int:
    public_key = _public_key(args)
    anchor = read_anchor(args.anchor.read_text(encoding="utf-8"), public_key) if args.anchor else None
    for option, directory in (("--archive", args.archive), ("--witness", args.witness)):
        if directory is not None and not directory.is_dir():
            complain("audit", f"{option}: {directory} is not a directory")
            return 2
    witnessed = _witnessed(args.witness, public_key) if args.witness is not None else []
    if args.witness is not None and not witnessed:
        complain("audit", f"--witness: {args.witness} holds no head (head-<seq>-<hash>.json)")
        return 2
    with Progress("audit verify", unit="events") as progress:
        report = verify(conn, anchor=anchor, anchors=witnessed, archive=args.archive, progress=progress)
    for problem in report.problems:
        print(problem.describe())
    summary = (f"{report.events + report.archived_events:,} events"
               + (f" ({report.archived_events:,} archived)" if report.archived_events else "")
               + f" and {report.checkpoints} checkpoint(s) checked in {report.seconds:.2f} s"
               f" ({report.events_per_second:,.0f} events/s)"
               + (f"; anchored at checkpoint {report.anchor_seq}" if report.anchor_seq is not None else "")
               + (f" ({report.anchors} heads)" if report.anchors > 1 else ""))
    if report.unchecked_below:
        summary += (f"; events below position {report.unchecked_below} are archived and were not checked"
                    " (add --archive DIR)")
    if report.problems:
        print(f"{len(report.problems)} problem(s); {summary}")
        return 1
    print(f"the log holds: {summary}")
    return 0


def _archive_dir(args: argparse.Namespace) -> Path | None:
    directory = args.archive or get_settings().archive_dir
    return Path(directory) if directory else None


def _export(conn, args: argparse.Namespace) -> int:
    for kind in ("job", "workflow"):
        found = audit_proof.proof(conn, kind, args.id, archive=_archive_dir(args))
        if found is not None:
            json.dump(found, sys.stdout, indent=1)
            print()
            return 0
    complain("audit", f"no job or workflow {args.id} in the log")
    return 1


ACTIONS = {"checkpoint": _checkpoint, "head": _head, "verify": _verify, "export": _export}
