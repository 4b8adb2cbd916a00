"""`qforge schedules list|show|create|pause|resume|update|delete` over the API."""

from __future__ import annotations

import argparse

from qforge.cli.remote import (add_api_arguments, fields, json_object, one_argument_actions, print_json, run_remote,
                               table)

COLUMNS = ("name", "cron", "timezone", "definition", "version", "paused", "next_fire_at", "fired", "last_tick")
FIELDS = ("name", "cron", "timezone", "job", "definition", "version", "inputs", "catch_up", "paused",
          "next_fire_at", "last_tick", "last_execution_id", "fired", "skipped", "created_at", "updated_at")


def _what(parser: argparse.ArgumentParser, creating: bool) -> None:
    parser.add_argument("--cron", required=creating, default=None,
                        help="five fields, or six with the seconds first")
    parser.add_argument("--timezone", default=None)
    what = parser.add_mutually_exclusive_group(required=creating)
    what.add_argument("--job", type=json_object, default=None, metavar="JSON", help="a POST /jobs body (or @FILE)")
    what.add_argument("--definition", default=None, help="a stored definition to run each tick")
    parser.add_argument("--version", type=int, default=None, help="pin the definition's version")
    parser.add_argument("--inputs", type=json_object, default=None, metavar="JSON")
    parser.add_argument("--catch-up", choices=["none", "latest", "all"], default=None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every schedule")
    add_api_arguments(listing)
    one_argument_actions(actions, {"show": "one schedule", "pause": "stop firing", "resume": "fire again",
                                   "delete": "remove a schedule"}, "name")
    create = actions.add_parser("create", help="a new schedule of a job or a stored definition")
    create.add_argument("name")
    _what(create, creating=True)
    create.add_argument("--paused", action="store_true")
    add_api_arguments(create)
    update = actions.add_parser("update", help="change a schedule (--latest unpins the version)")
    update.add_argument("name")
    _what(update, creating=False)
    update.add_argument("--latest", action="store_true", help="run the definition's latest version again")
    add_api_arguments(update)


def run(args: argparse.Namespace) -> int:
    return run_remote("schedules", args, lambda api: ACTIONS[args.action](api, args))


def _given(args: argparse.Namespace) -> dict:
    values = {"cron": args.cron, "timezone": args.timezone, "job": args.job, "definition": args.definition,
              "version": args.version, "inputs": args.inputs, "catch_up": args.catch_up}
    return {key: value for key, value in values.items() if value is not None}


def _one(schedule, args: argparse.Namespace) -> None:
    print_json(schedule) if args.json else fields(schedule, FIELDS)


def _list(api, args: argparse.Namespace) -> None:
    items = api.list_schedules()
    print_json(items) if args.json else table(items, COLUMNS)


def _create(api, args: argparse.Namespace) -> None:
    _one(api.create_schedule({"name": args.name, **_given(args), "paused": args.paused}), args)


def _update(api, args: argparse.Namespace) -> None:
    changes = _given(args)
    if args.latest:
        changes["version"] = None
    _one(api.update_schedule(args.name, **changes), args)


def _delete(api, args: argparse.Namespace) -> None:
    api.delete_schedule(args.name)
    print_json({"deleted": args.name}) if args.json else print(f"deleted {args.name}")


ACTIONS = {
    "list": _list, "create": _create, "update": _update, "delete": _delete,
    "show": lambda api, args: _one(api.get_schedule(args.name), args),
    "pause": lambda api, args: _one(api.pause_schedule(args.name), args),
    "resume": lambda api, args: _one(api.resume_schedule(args.name), args),
}
