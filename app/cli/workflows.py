"""`qforge workflows list|show|cancel|resume|trigger` over the API."""

from __future__ import annotations

import argparse

from qforge.cli.remote import (add_api_arguments, add_tag_argument, collect, events_table, fields, json_object,
                               one_argument_actions, print_json, run_remote, table)

LIST_COLUMNS = ("id", "name", "status", "step_counts", "tags", "created_at", "finished_at")
SHOW_FIELDS = ("id", "name", "status", "tags", "definition", "parent", "error", "result", "deadline_at",
               "created_at", "finished_at", "waiting_on")
STEP_COLUMNS = ("step", "status", "attempts", "depends_on", "job_id", "started_at", "finished_at", "error")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="workflows, newest first")
    listing.add_argument("--status", default=None)
    listing.add_argument("--name", default=None)
    add_tag_argument(listing)
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    add_api_arguments(listing)
    show = actions.add_parser("show", help="one workflow and its steps (with --events its history)")
    show.add_argument("id")
    show.add_argument("--events", action="store_true")
    add_api_arguments(show)
    one_argument_actions(actions, {"cancel": "cancel a running workflow",
                                   "resume": "run a failed or cancelled workflow's unsuccessful steps again"}, "id")
    trigger = actions.add_parser("trigger", help="complete a step waiting for a trigger")
    trigger.add_argument("id")
    trigger.add_argument("step")
    trigger.add_argument("--payload", type=json_object, default=None, metavar="JSON",
                         help="becomes the step's output (a JSON object, or @FILE)")
    add_api_arguments(trigger)


def run(args: argparse.Namespace) -> int:
    return run_remote("workflows", args, lambda api: ACTIONS[args.action](api, args))


def show_workflow(workflow, args: argparse.Namespace, events=None) -> None:
    if args.json:
        data = workflow.model_dump(mode="json")
        print_json({**data, **({"events": events} if events is not None else {})})
        return
    fields(workflow, SHOW_FIELDS)
    print()
    table(workflow.steps, STEP_COLUMNS)
    if events is not None:
        print()
        events_table(events, "stream_id")


def _list(api, args: argparse.Namespace) -> None:
    items = collect(lambda **page: api.list_workflows(status=args.status, name=args.name,
                                                      tags=dict(args.tag) or None, **page), args.limit)
    print_json(items) if args.json else table(items, LIST_COLUMNS)


def _show(api, args: argparse.Namespace) -> None:
    show_workflow(api.get_workflow(args.id), args, api.workflow_events(args.id) if args.events else None)


ACTIONS = {
    "list": _list,
    "show": _show,
    "cancel": lambda api, args: show_workflow(api.cancel_workflow(args.id), args),
    "resume": lambda api, args: show_workflow(api.resume(args.id), args),
    "trigger": lambda api, args: show_workflow(api.trigger(args.id, args.step, args.payload), args),
}
