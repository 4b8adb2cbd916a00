"""`qforge migrate [--status]`: apply what is pending, or list where every schema file stands."""

from __future__ import annotations

import argparse

import psycopg

from qforge.cli.common import complain, database_url
from qforge.db import connect, role_logins, set_role_passwords
from qforge.settings import get_settings
from qforge.migrate import SchemaError, describe, migrate, status


def run(args: argparse.Namespace) -> int:
    """Exit 0: done (or, with --status, nothing wrong); 1: the schema drifted or the database failed."""
    url = database_url("migrate", args.database_url, session=True)
    if url is None:
        return 1
    try:
        with connect(url, autocommit=True) as conn:
            if args.status:
                report = status(conn)
                for line in describe(report):
                    print(line)
                pending = len(report.to_apply)
                print(f"{len(report.drift)} problem(s), {pending} file(s) to apply"
                      + (" (run `qforge migrate`)" if pending else ""))
                return 1 if report.drift else 0
            applied = migrate(conn)
        # the roles' passwords: the embedded server's generated ones, or those of the
        # QFORGE_*_DATABASE_URL settings given to this command (docs/security.md)
        for role in set_role_passwords(url, role_logins(get_settings(), url)):
            print(f"password set for role {role}")
    except (SchemaError, psycopg.Error) as exc:
        notes = "".join(f"\n{note}" for note in getattr(exc, "__notes__", []))
        complain("migrate", f"{exc}{notes}")
        return 1
    for name in applied:
        print(f"applied {name}")
    if not applied:
        print("up to date")
    return 0
