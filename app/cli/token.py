"""`qforge token create NAME --scope S | list [--all] | revoke NAME`: API tokens, written to the log as `cli:<user>`."""

from __future__ import annotations

import argparse
import getpass

import psycopg

from qforge.cli.common import complain, database_url
from qforge.commands.errors import CommandError
from qforge.commands.tokens import create_token, list_tokens, revoke_token
from qforge.db import connect


def cli_actor() -> str:
    """Who runs the command, as the log will name them."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        user = "unknown"
    return f"cli:{user}"


def run(args: argparse.Namespace) -> int:
    """Exit 0: done; 1: refused (bad name, unknown or revoked token) or the database failed."""
    url = database_url("token", args.database_url)
    if url is None:
        return 1
    try:
        with connect(url, autocommit=True) as conn:
            if args.action == "create":
                # The secret alone on stdout, so `TOKEN=$(qforge token create ...)` works.
                print(create_token(conn, args.name, args.scope, actor=cli_actor()))
            elif args.action == "revoke":
                revoke_token(conn, args.name, actor=cli_actor())
                print(f"revoked {args.name}")
            else:
                rows = list_tokens(conn, include_revoked=args.all)
                print(f"{'NAME':<24} {'SCOPE':<8} {'STATUS':<8} {'CREATED':<20} CREATED BY")
                for row in rows:
                    print(f"{row['name']:<24} {row['scope']:<8} {row['status']:<8} "
                          f"{row['created_at']:%Y-%m-%d %H:%M:%S}  {row['created_by']}")
    except CommandError as exc:
        complain("token", exc.message)
        return 1
    except psycopg.Error as exc:
        complain("token", str(exc).strip().splitlines()[0])
        return 1
    return 0
