"""What the browser tests drive: `qforge` subprocesses (the stack) and a dashboard page that records console errors."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx
from playwright.sync_api import Page

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu",
    "--disable-background-networking", "--disable-component-update", "--no-first-run", "--disable-sync",
]
QFORGE = Path(sys.executable).parent / "qforge"
REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "test-output" / "screenshots"
VIEWPORT = {"width": 1280, "height": 800}

# Fast clocks: retries after ~0.1 s, stale jobs recovered within seconds.
STACK_ENV = {
    "QFORGE_HEARTBEAT_SECONDS": "0.5",
    "QFORGE_BACKOFF_BASE_SECONDS": "0.1",
    "QFORGE_STALE_SECONDS": "3",
}
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, message: str = "condition") -> Any:
    """Poll until `condition()` is truthy; its value, or AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Service:
    """One `qforge` subprocess in its own process group, its output in a log file."""

    kind: str
    popen: subprocess.Popen
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=STOP_TIMEOUT)
        else:
            self.popen.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Stack:
    """A running QForge: API on `url`, one worker, one monitor, one database."""

    db_url: str
    log_dir: Path
    port: int = field(default_factory=free_port)
    services: list[Service] = field(default_factory=list)
    api: Service | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self, kind: str, *args: str, env: dict[str, str] | None = None) -> Service:
        full_env = {**os.environ, **STACK_ENV, **self.env, **(env or {})}
        full_env.setdefault("LC_ALL", "C.UTF-8")
        full_env.pop("QFORGE_DATABASE_URL", None)
        if not (env and "QFORGE_API_TOKEN" in env):
            full_env.pop("QFORGE_API_TOKEN", None)
        log_path = self.log_dir / f"{kind}-{len(self.services)}.log"
        with open(log_path, "wb") as log_file:
            popen = subprocess.Popen(
                [str(QFORGE), kind, "--database-url", self.db_url, *args],
                stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=full_env, cwd=self.log_dir, start_new_session=True)
        service = Service(kind, popen, log_path)
        self.services.append(service)
        return service

    def start_api(self, port: int | None = None, env: dict[str, str] | None = None) -> Service:
        """Start `qforge api` on `port` (this stack's by default) and wait for /healthz."""
        port = port or self.port
        api = self.spawn("api", "--port", str(port), env=env)

        def healthy() -> bool:
            if not api.alive():
                raise AssertionError(f"qforge api exited:\n{api.log()}")
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, timeout=START_TIMEOUT, message="qforge api to answer /healthz")
        if port == self.port:
            self.api = api
        return api

    def restart_api(self) -> None:
        self.stop_api()
        self.start_api()

    def stop_api(self) -> None:
        assert self.api is not None
        self.api.stop()

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10)

    def close(self) -> None:
        for service in reversed(self.services):
            service.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {s.kind} (pid {s.popen.pid}) ---\n{s.log()}" for s in self.services)


@dataclass
class Dashboard:
    """A page on the dashboard plus what it said on the console and which dialogs it opened."""

    page: Page
    stack: Stack
    console_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def open(self, route: str = "") -> Page:
        """Load the dashboard at `#<route>` and wait until the live stream is connected."""
        self.page.goto(f"{self.stack.url}/{'#' + route if route else ''}")
        self.page.wait_for_selector("#live[data-state='live']", timeout=10_000)
        return self.page

    def screenshot(self, name: str, full_page: bool = False) -> Path:
        """Save test-output/screenshots/<name>.png (the folder is gitignored)."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        return path

    def assert_clean(self) -> None:
        assert self.console_errors == [], f"console errors: {self.console_errors}"
        assert self.dialogs == [], f"dialogs opened: {self.dialogs}"
