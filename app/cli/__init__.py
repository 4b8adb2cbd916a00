"""The ``qforge`` command line: one table of subcommands, each run from its own module of this package.

Command-line code lives here and only here: the domain packages (commands,
events, projections, workers) never import it. Each subcommand module is
imported only when that command runs, so `qforge --help` stays fast and a
command's heavy imports (uvicorn, the worker's task modules) cost the others
nothing.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable, Sequence

from pydantic import ValidationError

from qforge import __version__
from qforge.settings import get_settings, parse_duration

Handler = Callable[[argparse.Namespace], "int | None"]


@dataclass(frozen=True)
class Subcommand:
    """A ``qforge <name>`` command: its arguments and the module whose ``run(args)`` runs it."""

    name: str
    help: str
    module: str  # under qforge.cli
    add_arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None


def split_csv(value: str | None) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``: how --queues and --tasks are meant to be read."""
    return [item.strip() for item in (value or "").split(",") if item.strip()]


# ---------------------------------------------------------------------------
# Arguments of each subcommand. Defaults of None for --host and --port are
# filled from the settings after parsing, so handlers always see concrete values.


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queues", default="default", help="comma-separated queues to take jobs from")
    parser.add_argument("--concurrency", type=int, default=8, help="jobs run at once (default 8)")
    parser.add_argument("--tasks", default="", help="comma-separated modules to import for their @task functions")
    parser.add_argument("--name", default=None, help="worker name (default host-pid)")
    parser.add_argument("--allow-shell", action="store_true", help="allow the shell task on this worker")


def _api_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="address to listen on (default QFORGE_HOST, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port to listen on (default QFORGE_PORT, 8090)")
    parser.add_argument("--insecure-no-auth", action="store_true",
                        help="listen on a non-loopback address although no token exists (warns on every start)")


def _dev_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=None, help="API and dashboard port (default 8090)")
    parser.add_argument("--queues", default="default",
                        help="comma-separated queues its worker pools serve (default: default)")
    parser.add_argument("--print-database-url", action="store_true",
                        help="print the database URL qforge dev uses here (for psycopg.connect, "
                             "qforge.enqueue) and exit")
    parser.add_argument("--tasks", default="", help="comma-separated modules the two worker pools import "
                                                    "for their @task and @workflow functions")
    parser.add_argument("--attach", action="store_true",
                        help="when a qforge dev already runs in this folder: run another API and two more "
                             "pools on its database (named pool-N-<pid>) instead of refusing")


def _migrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", action="store_true",
                        help="list applied, pending and changed files; apply nothing")


def _iso_datetime(value: str) -> datetime:
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 time: {value!r}") from None


def _replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--verify", action="store_true", help="diff the rebuild against the live tables; exit 1 on any difference"
    )
    parser.add_argument("--archive", type=Path, default=None, metavar="DIR",
                        help="the archive directory: needed once `qforge archive` has moved part of the log there")
    as_of = parser.add_mutually_exclusive_group()
    as_of.add_argument("--as-of", type=int, default=None, metavar="POSITION", help="rebuild up to this log position")
    as_of.add_argument(
        "--as-of-time", type=_iso_datetime, default=None, metavar="ISO", help="rebuild up to this time (a datetime)"
    )


def _audit_arguments(parser: argparse.ArgumentParser) -> None:
    from qforge.cli.audit import add_arguments  # its sub-actions live with their code

    add_arguments(parser)


def duration(value: str) -> timedelta:
    """'30d', '12h', '90m', '45s', '2w' (or a number of seconds)."""
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _archive_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=["verify"],
                        help="verify: check an archive directory instead of archiving")
    parser.add_argument("directory", nargs="?", type=Path, help="with verify: the archive directory")
    parser.add_argument("--to", type=Path, default=None, metavar="DIR",
                        help="where segments go (default QFORGE_ARCHIVE_DIR)")
    parser.add_argument("--older-than", type=duration, default=None, metavar="DURATION",
                        help="only partitions whose last event is older than this (30d, 12h, ...)")
    parser.add_argument("--close-current", action="store_true",
                        help="first close the partition being written, so everything up to now can go")
    _batch_job_arguments(parser, "the archive", None, "QFORGE_ARCHIVE_DUTY or 0.5",
                         "QFORGE_ARCHIVE_BUSY_DUTY or 0.1")


def _batch_job_arguments(parser: argparse.ArgumentParser, what: str, duty: float | None, duty_default: str,
                         busy_default: str) -> None:
    """--duty, --busy-duty and --nice of a batch job beside a live queue (archive, pack)."""
    parser.add_argument("--duty", type=float, default=duty, metavar="SHARE",
                        help=f"the share of the time {what} works, resting the rest, so a live queue"
                             f" keeps its pace (0 < SHARE <= 1; default {duty_default})")
    parser.add_argument("--busy-duty", type=float, default=None, metavar="SHARE",
                        help="the share while the queue is busy (the log growing by 100 events/s or more),"
                             f" at most --duty (default {busy_default})")
    parser.add_argument("--nice", type=int, default=10, metavar="N",
                        help="lower this process's CPU priority by N (default 10; 0 leaves it)")


def _pack_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--close-current", action="store_true",
                        help="first close the partition being written, so everything up to now is packed")
    parser.add_argument("--keep", type=int, default=0, metavar="POSITIONS",
                        help="leave live the partitions that end within this many positions of the head"
                             " (default 0: every closed partition)")
    _batch_job_arguments(parser, "packing", 1.0, "1; the monitor's leader packs at QFORGE_LOG_PACK_DUTY",
                         "--duty")


def _history_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="a job's or a workflow's id")
    parser.add_argument("--archive", type=Path, default=None, metavar="DIR",
                        help="an archive directory to read the execution's archived events from")
def _token_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="make a token and print it (once; only its hash is kept)")
    create.add_argument("name", help="the token's name: the actor of every event written with it")
    create.add_argument("--scope", required=True, choices=["read", "operate", "admin"],
                        help="read: every GET and the stream; operate: also enqueue, submit, cancel,"
                             " retry, trigger; admin: everything, tokens included")
    listing = actions.add_parser("list", help="list active tokens")
    listing.add_argument("--all", action="store_true", help="revoked ones too")
    revoke = actions.add_parser("revoke", help="revoke a token (refused at once by every API process)")
    revoke.add_argument("name")


def _optional_number(kind: type) -> Callable[[str], "int | float | None"]:
    """A number, or `none` (clears the setting)."""
    def parse(value: str) -> "int | float | None":
        if value.lower() in ("none", "null"):
            return None
        try:
            return kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number (or none): {value!r}") from None
    return parse


def _keys_arguments(parser: argparse.ArgumentParser) -> None:
    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--api-url", default="http://127.0.0.1:8090",
                         help="the running API (the token comes from QFORGE_API_TOKEN)")
        sub.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of a table")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    common(actions.add_parser("list", help="configured keys and the keys jobs used: limits, weights, running"))
    show = actions.add_parser("show", help="one key")
    show.add_argument("key")
    common(show)
    change = actions.add_parser("set", help="set a key's limits (those not given keep their value)")
    change.add_argument("key")
    change.add_argument("--concurrency-limit", type=_optional_number(int), default=argparse.SUPPRESS,
                        help="jobs of this concurrency key running at once (none: each job's own)")
    change.add_argument("--weight", type=int, default=argparse.SUPPRESS, help="turns of this fairness key per rotation")
    change.add_argument("--rate-per-second", type=_optional_number(float), default=argparse.SUPPRESS,
                        help="claims per second of this key's jobs over all queues (none: no limit)")
    change.add_argument("--burst", type=int, default=argparse.SUPPRESS, help="claims allowed at once after a quiet spell")
    common(change)
def _remote_arguments(module: str) -> Callable[[argparse.ArgumentParser], None]:
    """The arguments of a command over the API, defined beside its code."""
    def add(parser: argparse.ArgumentParser) -> None:
        importlib.import_module(f"qforge.cli.{module}").add_arguments(parser)
    return add


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-url", default="http://127.0.0.1:8090", help="the running API to talk to")


SUBCOMMANDS: list[Subcommand] = [
    Subcommand("dev", "run everything on this machine: database, API + dashboard, monitor, workers",
               "dev", _dev_arguments),
    Subcommand("migrate", "apply pending migrations (safe to run twice or concurrently)", "migrate",
               _migrate_arguments),
    Subcommand("api", "serve the HTTP API and the dashboard", "api", _api_arguments),
    Subcommand("worker", "run a worker pool", "worker", _worker_arguments),
    Subcommand("monitor", "recover stale jobs, fire timers and trigger timeouts", "monitor"),
    Subcommand("replay", "rebuild the projections from the event log", "replay", _replay_arguments),
    Subcommand("audit", "the tamper-evident log: checkpoint, head, verify, export", "audit", _audit_arguments),
    Subcommand("archive", "write closed partitions of the log to archive segments, then drop them;"
               " or verify an archive", "archive", _archive_arguments),
    Subcommand("pack", "pack closed partitions of the log into compressed blocks, in the database"
               " (the monitor's leader does it too)", "pack", _pack_arguments),
    Subcommand("history", "print an execution's events, from the archive and the live log", "history",
               _history_arguments),
    Subcommand("token", "create, list and revoke API tokens", "token", _token_arguments),
    Subcommand("keys", "concurrency and fairness keys over the API: list, show, set limits", "keys",
               _keys_arguments),
    Subcommand("jobs", "list, show, cancel and retry jobs over the API (one by id, or all matching)",
               "jobs", _remote_arguments("jobs")),
    Subcommand("workflows", "list, show, cancel, resume and trigger workflows over the API", "workflows",
               _remote_arguments("workflows")),
    Subcommand("definitions", "stored workflow definitions over the API: list, show, put, run, diff",
               "definitions", _remote_arguments("definitions")),
    Subcommand("schedules", "schedules over the API: list, show, create, update, pause, resume, delete",
               "schedules", _remote_arguments("schedules")),
    Subcommand("demo", "enqueue sample jobs and a DAG workflow against a running API", "demo",
               _demo_arguments),
]


def build_parser() -> argparse.ArgumentParser:
    # --database-url is accepted before or after the subcommand; SUPPRESS keeps
    # the subparser from overwriting a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--database-url",
        default=argparse.SUPPRESS,
        help="PostgreSQL URL (default QFORGE_DATABASE_URL, else the embedded server in ./.qforge)",
    )
    parser = argparse.ArgumentParser(
        prog="qforge", description="Event-sourced job queue and DAG workflow orchestrator on PostgreSQL."
    )
    parser.add_argument("--database-url", default=None, help="PostgreSQL URL (also accepted after the command)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in SUBCOMMANDS:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help, parents=[common])
        command.add_arguments(sub)
        sub.set_defaults(module=command.module)
    return parser


def _fill_from_settings(args: argparse.Namespace) -> None:
    if getattr(args, "host", "") is None or getattr(args, "port", 0) is None:
        settings = get_settings()
        if getattr(args, "host", "") is None:
            args.host = settings.host
        if getattr(args, "port", 0) is None:
            args.port = settings.port


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _fill_from_settings(args)
        handler: Handler = importlib.import_module(f"qforge.cli.{args.module}").run
        code = handler(args)
    except KeyboardInterrupt:
        return 130
    except ValidationError as exc:  # a QFORGE_* variable that does not validate
        problems = "; ".join(f"QFORGE_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        print(f"qforge {args.command}: invalid setting: {problems}", file=sys.stderr)
        return 2
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
