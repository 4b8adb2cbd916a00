"""Serve the API in a background thread: for tests, benchmarks and embedding in another program."""

from __future__ import annotations

import threading
import time

import uvicorn


class BackgroundServer:
    """Serve an ASGI app with uvicorn in a thread on a free port (tests, benchmarks).

    `with BackgroundServer(app) as server: httpx.get(server.url + "/healthz")`
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        self._config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                                      lifespan="on", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(self._config)
        self.url = ""
        self._thread = None

    def __enter__(self) -> "BackgroundServer":
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
