"""`qforge jobs list|show|cancel|retry` over the API: one job by id, or every job matching filters
(POST /jobs/cancel and /jobs/retry, in parts, with progress)."""

from __future__ import annotations

import argparse
import sys

from qforge.cli.progress import Progress
from qforge.cli.remote import (add_api_arguments, add_tag_argument, collect, events_table, fields, print_json,
                               run_remote, table)

LIST_COLUMNS = ("id", "task", "queue", "status", "attempts", "tags", "created_at")
SHOW_FIELDS = ("id", "task", "queue", "status", "priority", "attempts", "max_retries", "run_at", "tags",
               "workflow_id", "step", "worker", "heartbeat_at", "payload", "result", "last_error",
               "created_at", "updated_at")
PART = 1000  # jobs a request of a bulk action looks at: the progress moves at least this often


def _filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", default=None, help="only jobs in this status")
    parser.add_argument("--queue", default=None)
    parser.add_argument("--task", default=None)
    add_tag_argument(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="jobs, newest first")
    _filters(listing)
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    add_api_arguments(listing)
    show = actions.add_parser("show", help="one job, and with --events its history")
    show.add_argument("id")
    show.add_argument("--events", action="store_true", help="its events too")
    add_api_arguments(show)
    for name, what in (("cancel", "cancel jobs that have not finished"),
                       ("retry", "run dead or cancelled jobs again")):
        action = actions.add_parser(name, help=f"{what}: by id, or every job matching the filters",
                                    description=f"{what}: the ids given, or every job matching the filters"
                                                " (at least one, or --all-matching)")
        action.add_argument("ids", nargs="*", metavar="ID")
        _filters(action)
        action.add_argument("--all-matching", action="store_true",
                            help="with no filter: every job the action applies to")
        action.add_argument("--dry-run", action="store_true", help="only count the matching jobs")
        add_api_arguments(action)


def run(args: argparse.Namespace) -> int:
    return run_remote("jobs", args, lambda api: ACTIONS[args.action](api, args))


def _tags(args: argparse.Namespace) -> dict[str, str] | None:
    return dict(args.tag) if args.tag else None


def _list(api, args: argparse.Namespace) -> None:
    items = collect(lambda **page: api.list_jobs(status=args.status, queue=args.queue, task=args.task,
                                                 tags=_tags(args), **page), args.limit)
    print_json(items) if args.json else table(items, LIST_COLUMNS)


def _show(api, args: argparse.Namespace) -> None:
    job = api.get_job(args.id)
    events = api.job_events(args.id) if args.events else None
    if args.json:
        print_json({**job.model_dump(mode="json"), **({"events": events} if events is not None else {})})
        return
    fields(job, SHOW_FIELDS)
    if events is not None:
        print()
        events_table(events, "version")


def _act(api, args: argparse.Namespace) -> int:
    filtered = any((args.status, args.queue, args.task, args.tag))
    if args.ids and (filtered or args.all_matching):
        print(f"qforge jobs {args.action}: give ids or filters, not both", file=sys.stderr)
        return 2
    if args.ids:
        one = api.cancel if args.action == "cancel" else api.retry
        jobs = [one(job_id) for job_id in args.ids]
        if args.json:
            print_json(jobs)
        else:
            table(jobs, ("id", "task", "status"))
        return 0
    if not filtered and not args.all_matching:
        print(f"qforge jobs {args.action}: name jobs by id, or by --status/--queue/--task/--tag"
              " (--all-matching for every job)", file=sys.stderr)
        return 2
    bulk = api.cancel_matching if args.action == "cancel" else api.retry_matching
    filters = {"status": args.status, "queue": args.queue, "task": args.task, "tags": _tags(args)}
    total = bulk(**filters, dry_run=True).count
    if args.dry_run:
        print_json({"count": total}) if args.json else print(f"{total} jobs match")
        return 0
    count, after = 0, None
    verb = "cancelled" if args.action == "cancel" else "retried"
    with Progress(f"{args.action}", total=total, unit="jobs") as progress:
        while True:
            part = bulk(**filters, limit=PART, after=after)
            count += part.count
            progress.update(count, max(total, count))
            after = part.next
            if after is None:
                break
    print_json({"count": count}) if args.json else print(f"{verb} {count} jobs")
    return 0


ACTIONS = {"list": _list, "show": _show, "cancel": _act, "retry": _act}
