"""`qforge keys list | show KEY | set KEY [--concurrency-limit N] [--weight N] [--rate-per-second R] [--burst N]`
over the HTTP API (--api-url; the token from QFORGE_API_TOKEN): a table for people, --json for scripts."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import httpx

from qforge.cli.common import complain
from qforge.client import Client
from qforge.client.errors import ApiError

COLUMNS = (("KEY", "key"), ("CONCURRENCY", "concurrency_limit_in_force"), ("CONFIGURED", "concurrency_limit"),
           ("WEIGHT", "weight"), ("RATE/S", "rate_per_second"), ("BURST", "burst"), ("RUNNING", "running"),
           ("CLAIMED", "fairness_claimed"))
SETTINGS = ("concurrency_limit", "weight", "rate_per_second", "burst")


def run(args: argparse.Namespace) -> int:
    """Exit 0: done; 1: the API refused (its message on stderr) or could not be reached."""
    try:
        with Client(args.api_url, token=os.environ.get("QFORGE_API_TOKEN") or None) as client:
            if args.action == "list":
                keys = client.keys(limit=500)
            elif args.action == "show":
                keys = [client.key(args.key)]
            else:
                # options not given are absent from args (argparse.SUPPRESS); `none` is None
                given = {name: getattr(args, name) for name in SETTINGS if hasattr(args, name)}
                if not given:
                    complain("keys", "set: nothing to set (--concurrency-limit, --weight, --rate-per-second, --burst)")
                    return 1
                keys = [client.set_key(args.key, **given)]
    except ApiError as exc:
        complain("keys", f"{exc.message}" + (f" {json.dumps(exc.details)}" if exc.details else ""))
        return 1
    except httpx.TransportError as exc:
        complain("keys", f"cannot reach the API at {args.api_url} ({exc})")
        return 1
    rows = [key.model_dump(mode="json") for key in keys]
    if args.json:
        print(json.dumps(rows if args.action == "list" else rows[0], indent=2))
    else:
        print_table(rows)
    return 0


def print_table(rows: list[dict[str, Any]]) -> None:
    cells = [[header for header, _ in COLUMNS]]
    cells += [["-" if row[field] is None else f"{row[field]:g}" if isinstance(row[field], float) else str(row[field])
               for _, field in COLUMNS] for row in rows]
    widths = [max(len(line[n]) for line in cells) for n in range(len(COLUMNS))]
    for line in cells:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
