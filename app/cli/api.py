"""`qforge api`: migrate, then serve the API and the dashboard with uvicorn.

Safe by default: without any token (nor QFORGE_API_TOKEN) every request is
`anonymous` with every scope, so it listens only on a loopback address unless
started with --insecure-no-auth, which it then says on every start.
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import socket

import psycopg
import uvicorn

from qforge import tracing
from qforge.api.app import create_app
from qforge.cli.common import complain, configure_logging, database_url
from qforge.commands.tokens import tokens_exist
from qforge.db import connect, stop_embedded
from qforge.migrate import SchemaError, check, migrate
from qforge.settings import Settings, get_settings


def is_loopback(host: str) -> bool:
    """Does every address `host` names belong to this machine alone?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def run(args: argparse.Namespace) -> int:
    configure_logging(get_settings())  # so the pool's "database unreachable / back" lines show
    settings = get_settings()
    url = database_url("api", args.database_url, role="api")
    if url is None:
        return 1
    owner_url, readonly_url = _owner_and_readonly_urls(args, settings, url)
    if owner_url is None:
        return 1
    try:
        applied, protected = _prepare_schema(url, owner_url)
    except (SchemaError, psycopg.Error) as exc:
        complain("api", exc)
        stop_embedded()
        return 1
    for name in applied:
        print(f"applied {name}", flush=True)
    tracing.configure("qforge-api")  # from OTEL_* variables, when set
    if not protected and not _may_serve_unprotected(args):
        stop_embedded()
        return 2
    try:
        return _serve(args, url, readonly_url)
    finally:
        stop_embedded()


def _owner_and_readonly_urls(args: argparse.Namespace, settings: Settings,
                             url: str) -> tuple[str | None, str | None]:
    """(the schema owner's URL, else `url`; the read-only role's URL, else None)."""
    # Migrating needs the schema owner: this process has its URL only with the embedded
    # server (credentials.json) or a single-role setup; otherwise it checks the schema.
    owner_url: str | None = url
    if args.database_url or settings.database_url or not settings.api_database_url:
        owner_url = database_url("api", args.database_url)
    # The reads run as the read-only role (issue 30) when this process knows its URL.
    readonly_url = None
    if settings.readonly_database_url or not (args.database_url or settings.database_url
                                              or settings.api_database_url):
        readonly_url = database_url("api", None, role="read")
    return owner_url, readonly_url


def _prepare_schema(url: str, owner_url: str) -> tuple[list[str], bool]:
    """Migrate as the owner (or, when this role may not, check the schema is current); the
    migrations applied and whether any token protects the API."""
    applied = []
    try:
        with connect(owner_url, autocommit=True) as conn:
            applied = migrate(conn)  # safe to run from many processes at once
    except psycopg.errors.InsufficientPrivilege:
        # the API's own role (issue 30) may not migrate: the schema must be current
        with connect(url, autocommit=True) as conn:
            check(conn)
    with connect(url, autocommit=True) as conn:
        protected = bool(get_settings().api_token) or tokens_exist(conn)
    return applied, protected


def _may_serve_unprotected(args: argparse.Namespace) -> bool:
    """No token exists: serve only on a loopback address or with --insecure-no-auth (said aloud)."""
    if args.insecure_no_auth:
        complain("api", "WARNING: --insecure-no-auth: no token exists, so anyone who reaches"
                        f" {args.host}:{args.port} may run shell commands on the workers"
                        " (`qforge token create NAME --scope admin` turns authentication on)")
    elif not is_loopback(args.host):
        complain("api", f"refusing to listen on {args.host} while no token exists: anyone could"
                        " use the API. Create one first (`qforge token create NAME --scope admin`),"
                        " or listen on 127.0.0.1, or pass --insecure-no-auth")
        return False
    return True


def _serve(args: argparse.Namespace, url: str, readonly_url: str | None) -> int:
    config = uvicorn.Config(create_app(url, bound_host=args.host, readonly_url=readonly_url),
                            host=args.host, port=args.port,
                            log_level="info", timeout_graceful_shutdown=5)
    # What is loaded by now (modules, the app, its routes: ~100,000 tracked objects) lives as
    # long as the process: out of the collector's sight, a full collection takes
    # milliseconds instead of ~0.1 s during which no event stream moves.
    gc.collect()
    gc.freeze()
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1
