"""What the day-to-day commands over the API share (`qforge jobs|workflows|definitions|schedules`):
the client from --api-url and QFORGE_API_TOKEN, tables for people, --json for scripts, and one
way to say that a request failed."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import httpx

from qforge.cli.common import complain

DEFAULT_API_URL = "http://127.0.0.1:8090"


def add_api_arguments(parser: argparse.ArgumentParser) -> None:
    """--api-url and --json, on every action of a command over the API."""
    parser.add_argument("--api-url", default=None,
                        help=f"the API (default QFORGE_API_URL, else {DEFAULT_API_URL}); the token is"
                             " QFORGE_API_TOKEN's")
    parser.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of a table")


def add_tag_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tag", action="append", default=[], metavar="KEY:VALUE", type=tag_pair,
                        help="only those carrying this tag (repeat for more: all must match)")


def tag_pair(value: str) -> tuple[str, str]:
    key, sep, item = value.partition(":")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"not KEY:VALUE: {value!r}")
    return key, item


def json_object(value: str) -> dict[str, Any]:
    """A JSON object argument, or `@FILE` to read it from a file (`@-`: standard input)."""
    try:
        text = (sys.stdin.read() if value == "@-" else Path(value[1:]).read_text()) \
            if value.startswith("@") else value
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {value[1:]}: {exc.strerror}") from None
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError("not a JSON object")
    return parsed


def client(args: argparse.Namespace):
    from qforge.client import Client

    url = args.api_url or os.environ.get("QFORGE_API_URL") or DEFAULT_API_URL
    return Client(url, token=os.environ.get("QFORGE_API_TOKEN") or None, timeout=600.0)


def run_remote(command: str, args: argparse.Namespace, action: Callable[[Any], int | None]) -> int:
    """`action(client)`; an error of the API or of the connection is one line on stderr and
    exit 1 (2 for input the API called invalid)."""
    from qforge.client import ApiError

    try:
        with client(args) as api:
            return int(action(api) or 0)
    except ApiError as exc:
        details = "; ".join(str(d.get("message", d)) if isinstance(d, dict) else str(d)
                            for d in (exc.details or [])[:5])
        complain(command, f"{exc.status} {exc.error}: {exc.message}" + (f" ({details})" if details
                                                                          and details not in exc.message else ""))
        return 2 if exc.status in (400, 422) else 1
    except httpx.HTTPError as exc:
        complain(command, f"the API did not answer: {exc}")
        return 1


def as_json(value: Any) -> Any:
    """Models, lists of them and plain values as JSON-ready data."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [as_json(item) for item in value]
    if isinstance(value, dict):
        return {key: as_json(item) for key, item in value.items()}
    return value


def print_json(value: Any) -> None:
    print(json.dumps(as_json(value), indent=2, default=str))


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "-"
    return str(value)


def table(rows: Iterable[Any], columns: Sequence[str], *, width: int = 48) -> None:
    """A plain table: a header of the column names in capitals, one line per row (cells cut at `width`)."""
    lines = [[cell(row.get(c) if isinstance(row, dict) else getattr(row, c, None))[:width] for c in columns]
             for row in rows]
    widths = [max([len(c)] + [len(line[i]) for line in lines]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip())
    for line in lines:
        print("  ".join(text.ljust(w) for text, w in zip(line, widths)).rstrip())


def fields(value: Any, names: Sequence[str]) -> None:
    """One `name: value` line per field (a record for people)."""
    data = as_json(value)
    for name in names:
        shown = data.get(name)
        print(f"{name + ':':<14} {json.dumps(shown) if isinstance(shown, (dict, list)) else cell(shown)}")


def collect(page: Callable[..., Any], limit: int | None = None) -> list[Any]:
    """The items of `page(limit=, cursor=)` page after page, up to `limit` (None: all)."""
    items: list[Any] = []
    cursor = None
    while limit is None or len(items) < limit:
        found = page(limit=500 if limit is None else min(500, limit - len(items)), cursor=cursor)
        items += found.items
        cursor = found.next
        if not cursor:
            break
    return items


def events_table(events: Iterable[Any], stream_column: str) -> None:
    """An execution's events, one line each (`stream_column`: version for a job, stream_id for a
    workflow, whose events come from several streams)."""
    columns = ("position", stream_column, "type", "actor", "occurred_at")
    table([{name: getattr(event, name) for name in columns} for event in events], columns)


def one_argument_actions(actions: Any, helps: dict[str, str], argument: str) -> None:
    """Actions that take one positional argument (a name or an id) and the API options."""
    for name, what in helps.items():
        action = actions.add_parser(name, help=what)
        action.add_argument(argument)
        add_api_arguments(action)
