"""`qforge definitions list|show|put|run|diff` over the API: stored, versioned workflow definitions."""

from __future__ import annotations

import argparse
import difflib
import json

from qforge.cli.remote import add_api_arguments, collect, json_object, print_json, run_remote, table, tag_pair
from qforge.cli.workflows import show_workflow


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every definition's latest version")
    add_api_arguments(listing)
    show = actions.add_parser("show", help="a definition's latest version, or --version N")
    show.add_argument("name")
    show.add_argument("--version", type=int, default=None)
    add_api_arguments(show)
    put = actions.add_parser("put", help="store a new version from a JSON body (a file, or - for stdin)")
    put.add_argument("name")
    put.add_argument("body", metavar="FILE", type=lambda path: json_object("@" + path),
                     help="the definition as JSON: a file, or - for standard input")
    add_api_arguments(put)
    run = actions.add_parser("run", help="start a workflow of the latest version, or --version N")
    run.add_argument("name")
    run.add_argument("--version", type=int, default=None, help="the version to run (default: the latest)")
    run.add_argument("--inputs", type=json_object, default=None, metavar="JSON",
                     help="the root steps' inputs (a JSON object, or @FILE)")
    run.add_argument("--tag", action="append", default=[], metavar="KEY:VALUE", type=tag_pair)
    run.add_argument("--idempotency-key", default=None)
    add_api_arguments(run)
    diff = actions.add_parser("diff", help="what changed between two versions (a unified diff)")
    diff.add_argument("name")
    diff.add_argument("old", type=int, help="a version")
    diff.add_argument("new", type=int, nargs="?", default=None, help="another version (default: the latest)")
    add_api_arguments(diff)


def run(args: argparse.Namespace) -> int:
    return run_remote("definitions", args, lambda api: ACTIONS[args.action](api, args))


def _list(api, args: argparse.Namespace) -> None:
    items = collect(api.list_definitions)
    if args.json:
        print_json(items)
    else:
        table([{"name": d.name, "version": d.version, "steps": len(d.document.get("steps", [])),
                "updated_at": d.updated_at} for d in items], ("name", "version", "steps", "updated_at"))


def _show(api, args: argparse.Namespace) -> None:
    found = api.get_definition(args.name, args.version)
    if args.json:
        print_json(found)
        return
    print(f"{found.name} version {found.version} of {found.latest_version}, stored {found.created_at:%Y-%m-%d %H:%M:%S}"
          f" by {found.actor}")
    print(json.dumps(found.document, indent=2))


def _put(api, args: argparse.Namespace) -> None:
    stored = api.put_definition(args.name, args.body)
    print_json(stored) if args.json else print(f"stored {stored.name} version {stored.version}")


def _run(api, args: argparse.Namespace) -> None:
    workflow = api.run_definition(args.name, args.inputs, version=args.version, tags=dict(args.tag) or None,
                                  idempotency_key=args.idempotency_key)
    show_workflow(workflow, args)


def document_lines(document: dict) -> list[str]:
    return json.dumps(document, indent=2, sort_keys=True).splitlines(keepends=True)


def _diff(api, args: argparse.Namespace) -> None:
    old = api.get_definition(args.name, args.old)
    new = api.get_definition(args.name, args.new)
    lines = list(difflib.unified_diff(document_lines(old.document), document_lines(new.document),
                                      f"{args.name} version {old.version}", f"{args.name} version {new.version}"))
    if args.json:
        print_json({"old": old.version, "new": new.version, "diff": "".join(lines)})
    else:
        print("".join(lines), end="")


ACTIONS = {"list": _list, "show": _show, "put": _put, "run": _run, "diff": _diff}
