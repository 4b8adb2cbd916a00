"""`qforge api`: migrate, then serve the API and the dashboard with uvicorn."""

from __future__ import annotations

import argparse
import sys

import psycopg

from app.db import EmbeddedPostgresError, connect, resolve_database_url, stop_embedded
from app.migrate import migrate


def cli_main(args: argparse.Namespace) -> int:
    import uvicorn

    from app.api.app import create_app

    try:
        url = resolve_database_url(args.database_url)
        with connect(url, autocommit=True) as conn:
            applied = migrate(conn)  # safe to run from many processes at once
    except (EmbeddedPostgresError, psycopg.OperationalError) as exc:
        print(f"qforge api: {exc}", file=sys.stderr)
        stop_embedded()
        return 1
    for name in applied:
        print(f"applied {name}", flush=True)
    try:
        config = uvicorn.Config(create_app(url), host=args.host, port=args.port,
                                log_level="info", timeout_graceful_shutdown=5)
        server = uvicorn.Server(config)
        server.run()
        return 0 if server.started else 1
    finally:
        stop_embedded()


class BackgroundServer:
    """Serve an ASGI app with uvicorn in a thread on a free port (tests, benchmarks).

    `with BackgroundServer(app) as server: httpx.get(server.url + "/healthz")`
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self._config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                                      lifespan="on", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(self._config)
        self.url = ""
        self._thread = None

    def __enter__(self) -> "BackgroundServer":
        import threading
        import time

        self._thread = threading.Thread(target=self.server.run, name="qforge-test-api", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the API server did not start")
            time.sleep(0.01)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
