"""`qforge api`: migrate, then serve the API and the dashboard with uvicorn."""

from __future__ import annotations

import argparse

import psycopg
import uvicorn

from qforge import tracing
from qforge.api.app import create_app
from qforge.cli.common import complain, database_url
from qforge.db import connect, stop_embedded
from qforge.migrate import SchemaError, migrate


def run(args: argparse.Namespace) -> int:
    url = database_url("api", args.database_url)
    if url is None:
        return 1
    try:
        with connect(url, autocommit=True) as conn:
            applied = migrate(conn)  # safe to run from many processes at once
    except (SchemaError, psycopg.Error) as exc:
        complain("api", exc)
        stop_embedded()
        return 1
    for name in applied:
        print(f"applied {name}", flush=True)
    tracing.configure("qforge-api")  # from OTEL_* variables, when set
    try:
        config = uvicorn.Config(create_app(url), host=args.host, port=args.port,
                                log_level="info", timeout_graceful_shutdown=5)
        server = uvicorn.Server(config)
        server.run()
        return 0 if server.started else 1
    finally:
        stop_embedded()
