"""`qforge dev`: the whole system on one machine, as one supervised process tree.

PostgreSQL (embedded, unless a URL is given) and migrations in this process;
the API + dashboard, the monitor and two worker pools as child processes
(`python -m qforge.cli ...`, each in its own session so a terminal's Ctrl-C
reaches only this supervisor, which then stops them in order). A child that
crashes is restarted with backoff. Ctrl-C or SIGTERM stops every child, then
PostgreSQL, and exits 0; the data stays in ./.qforge/pgdata for the next run.

One qforge dev owns a folder's data: it says so in ./.qforge/dev.json (its pid, port and
database URL). A second one in the same folder refuses, naming them, unless --attach: then
it runs its own API and pools (named apart) on the first one's server, which it neither
starts nor stops.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

from qforge.db import (EMBEDDED_SUPERUSER, ROLE_KINDS, ROLE_URL_SETTINGS, EmbeddedPostgres, EmbeddedPostgresError, connect,
                       embedded_credentials, role_logins, role_name, set_role_passwords, with_credentials)
from qforge.commands.specs import NAME_PATTERN
from qforge.migrate import SchemaError, migrate
from qforge.settings import get_settings

POOL_CONCURRENCY = 4
STOP_GRACE_SECONDS = 20.0  # workers hand back or finish their jobs; then SIGKILL
RESTART_BACKOFF_MAX = 30.0
HEALTHY_AFTER_SECONDS = 30.0  # a child that ran this long restarts with a fresh backoff
BAD_USAGE_EXIT = 2  # argparse's exit code for arguments it refuses

_PR_SET_PDEATHSIG = 1
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:  # not Linux: children are still stopped by the supervisor
    _LIBC = None


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the supervisor is killed outright."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _say(text: str) -> None:
    print(f"qforge dev | {text}", flush=True)


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    backoff: float = 1.0
    given_up: bool = False
    pumps: list[threading.Thread] = field(default_factory=list)

    def start(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "qforge.cli", *self.argv], env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent)
        self.started_at, self.restart_at = time.monotonic(), None
        pump = threading.Thread(target=_pump, args=(self.name, self.process.stdout),
                                name=f"output-{self.name}", daemon=True)
        pump.start()
        self.pumps.append(pump)

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signum)
            except ProcessLookupError:
                pass


def _pump(name: str, stream) -> None:
    """Copy a child's output, each line prefixed with its name."""
    with stream:
        for raw in iter(stream.readline, b""):
            sys.stdout.write(f"{name:>8} | {raw.decode(errors='replace').rstrip()}\n")
            sys.stdout.flush()


def children(port: int, queues: str = "default", tasks: str = "", suffix: str = "",
             monitor: bool = True) -> list[Child]:
    """The API, the monitor (unless attached: the owner runs one) and two pools serving `queues`
    (importing `tasks`), whose names end in `suffix` so that attached pools are not taken for the
    owner's."""
    pool = ["worker", "--allow-shell", "--concurrency", str(POOL_CONCURRENCY), "--queues", queues,
            *(["--tasks", tasks] if tasks else [])]
    return [
        Child("api", ["api", "--host", "127.0.0.1", "--port", str(port)]),
        *([Child("monitor", ["monitor"])] if monitor else []),
        Child(f"pool-1{suffix}", [*pool, "--name", f"pool-1{suffix}"]),
        Child(f"pool-2{suffix}", [*pool, "--name", f"pool-2{suffix}"]),
    ]


def _owner(claim: Path) -> dict | None:
    """The running qforge dev that owns this folder's data, from its claim; None when none runs."""
    try:
        owner = json.loads(claim.read_text())
        pid = int(owner["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # it was killed outright: its claim is stale
    except PermissionError:
        pass  # alive, another user's
    return owner


def _claim(claim: Path, port: int, url: str) -> None:
    """This folder's qforge dev, for a second one to find: 0600, the URL carries the owner's password."""
    fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"pid": os.getpid(), "port": port, "database_url": url}, out)


def _release(claim: Path) -> None:
    owner = _owner(claim) if claim.exists() else None
    if owner is None:  # ours (or stale): a claim another live qforge dev wrote stays
        claim.unlink(missing_ok=True)


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def healthy(base_url: str) -> bool:
    """Does the API at `base_url` answer /healthz (the tests wait on it too)?"""
    try:
        return httpx.get(f"{base_url}/healthz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


class Supervisor:
    def __init__(self, port: int, env: dict[str, str], queues: str = "default", tasks: str = "",
                 suffix: str = "", monitor: bool = True, database_url: str = ""):
        self.port, self.env, self.database_url = port, env, database_url
        self.queues = queues
        self.children = children(port, queues, tasks, suffix, monitor)
        self.stopping = threading.Event()

    def request_stop(self, signum: int, _frame: object) -> None:
        if not self.stopping.is_set():
            _say(f"{signal.Signals(signum).name}: stopping")
        self.stopping.set()

    def run(self) -> None:
        for child in self.children:
            child.start(self.env)
        announced = False
        while not self.stopping.wait(0.2):
            now = time.monotonic()
            for child in self.children:
                self._watch(child, now)
            if not announced and healthy(f"http://127.0.0.1:{self.port}"):
                announced = True
                _say(f"ready: dashboard and API on http://127.0.0.1:{self.port}, workers on queues "
                     f"{self.queues}, database {self.database_url} (Ctrl-C stops)")
        self.stop_all()

    def _watch(self, child: Child, now: float) -> None:
        if child.given_up:
            return
        if child.restart_at is not None:
            if now >= child.restart_at:
                _say(f"restarting {child.name}")
                child.start(self.env)
            return
        code = child.process.poll() if child.process else None
        if code is None:
            return
        if code == BAD_USAGE_EXIT and now - child.started_at < 5:
            child.given_up = True  # restarting would only fail again
            _say(f"{child.name} refused its arguments (exit {code}); running without it")
            return
        if now - child.started_at > HEALTHY_AFTER_SECONDS:
            child.backoff = 1.0
        _say(f"{child.name} exited with {code}; restarting in {child.backoff:.0f}s")
        child.restart_at = now + child.backoff
        child.backoff = min(child.backoff * 2, RESTART_BACKOFF_MAX)

    def stop_all(self) -> None:
        running = [c for c in self.children if c.process and c.process.poll() is None]
        for child in running:
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in running:
            try:
                child.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                _say(f"{child.name} did not stop in {STOP_GRACE_SECONDS:.0f}s; killing it")
                child.signal(signal.SIGKILL)
                child.process.wait()
        for child in self.children:
            for pump in child.pumps:
                pump.join(timeout=2)


def _queues(text: str) -> str | None:
    """--queues as the workers take it, or None when it names no queue or a malformed one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or not all(re.fullmatch(NAME_PATTERN, name) for name in names):
        return None
    return ",".join(dict.fromkeys(names))


def print_database_url(url: str | None, data_dir: str) -> int:
    """--print-database-url: the URL given, else the embedded server's in this folder (attached
    to, or started for the moment: its socket lives in the data directory, so the URL stays)."""
    if url:
        print(url)
        return 0
    pgdata = Path(data_dir).expanduser().absolute() / "pgdata"
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    embedded = EmbeddedPostgres()
    try:
        server_url = embedded.start(pgdata, cleanup_mode="stop")
        credentials = embedded_credentials(pgdata.parent, pgdata.resolve(), server_url)
        # The schema owner's login (the server asks for passwords): the application's, in dev.
        print(with_credentials(server_url, EMBEDDED_SUPERUSER, credentials["owner"]))
    except (EmbeddedPostgresError, OSError) as exc:
        print(f"qforge dev: {exc}", file=sys.stderr)
        return 1
    finally:
        embedded.stop()  # stops the server only when no qforge dev uses it
    return 0


def run(args: argparse.Namespace) -> int:
    settings = get_settings()
    if args.print_database_url:
        return print_database_url(args.database_url or settings.database_url, settings.data_dir)
    queues = _queues(args.queues)
    if queues is None:
        print(f"qforge dev: --queues {args.queues!r}: give comma-separated queue names "
              "(letters, digits, _ . : -)", file=sys.stderr)
        return BAD_USAGE_EXIT
    port = args.port if args.port is not None else settings.port
    data_dir = Path(settings.data_dir).expanduser().absolute()
    claim = data_dir / "dev.json"
    owner = _owner(claim)
    refusal = _refusal(args, owner, port)
    if refusal is not None:
        print(f"qforge dev: {refusal}", file=sys.stderr)
        return 1
    url = args.database_url or settings.database_url
    suffix = ""
    if owner is not None:
        url, suffix = owner["database_url"], f"-{os.getpid()}"
        _say(f"attaching to the qforge dev of pid {owner['pid']} (port {owner.get('port')}): its PostgreSQL, "
             f"which this one neither starts nor stops; pools pool-1{suffix} and pool-2{suffix}, no monitor")
    database = _database(args, settings, data_dir, owner, url)
    if database is None:
        return 1
    embedded, url, role_urls = database
    supervisor = Supervisor(port, _child_environment(url, role_urls), queues, getattr(args, "tasks", "") or "",
                            suffix, monitor=owner is None, database_url=url)
    previous = {sig: signal.signal(sig, supervisor.request_stop)
                for sig in (signal.SIGINT, signal.SIGTERM)}
    if owner is None:
        data_dir.mkdir(parents=True, exist_ok=True)
        _claim(claim, port, url)
    try:
        supervisor.run()
    finally:
        supervisor.stop_all()
        if owner is None:
            _release(claim)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if embedded is not None:
            _say("stopping PostgreSQL")
            embedded.stop()
    _say("stopped")
    return 0


def _refusal(args: argparse.Namespace, owner: dict | None, port: int) -> str | None:
    """Why this qforge dev cannot start here (another owns the folder, the port is taken), or None."""
    if owner is not None and not getattr(args, "attach", False):
        return (f"another qforge dev runs in this folder (pid {owner['pid']}, dashboard on "
                f"http://127.0.0.1:{owner.get('port')}); use it, stop it, or run this one with --attach "
                f"to add an API on port {port} and two pools to it")
    if not _port_free("127.0.0.1", port):
        return (f"port {port} on 127.0.0.1 is in use (another qforge dev?); "
                "choose another with --port")
    return None


def _database(args: argparse.Namespace, settings, data_dir: Path, owner: dict | None,
              url: str | None) -> tuple[EmbeddedPostgres | None, str, dict[str, str]] | None:
    """The database ready for the children: (the embedded server this process started, if any;
    the owner's URL; the roles' URLs by setting name, when known), or None after saying why not."""
    embedded: EmbeddedPostgres | None = None
    role_urls: dict[str, str] = {}
    try:
        if owner is not None and not (args.database_url or settings.database_url):
            credentials = embedded_credentials(data_dir, (data_dir / "pgdata").resolve(), url)
            role_urls = {ROLE_URL_SETTINGS[kind]: with_credentials(url, role_name(settings.role_prefix, kind),
                                                                   credentials[kind]) for kind in ROLE_KINDS}
        if not url:
            pgdata = data_dir / "pgdata"
            pgdata.parent.mkdir(parents=True, exist_ok=True)
            embedded = EmbeddedPostgres()
            _say(f"starting PostgreSQL in {pgdata}")
            server_url = embedded.start(pgdata, cleanup_mode="stop")
            # passwords only (scram-sha-256): the owner's and each role's, kept in credentials.json
            credentials = embedded_credentials(pgdata.parent, pgdata.resolve(), server_url)
            url = with_credentials(server_url, EMBEDDED_SUPERUSER, credentials["owner"])
            role_urls = {ROLE_URL_SETTINGS[kind]: with_credentials(server_url, role_name(settings.role_prefix, kind),
                                                                   credentials[kind]) for kind in ROLE_KINDS}
        with connect(url, autocommit=True) as conn:
            for name in migrate(conn):
                _say(f"applied {name}")
        set_role_passwords(url, role_logins(settings, url) if not (embedded or role_urls) else
                           {role_name(settings.role_prefix, kind): credentials[kind] for kind in ROLE_KINDS})
    except (EmbeddedPostgresError, SchemaError, psycopg.Error, OSError) as exc:
        print(f"qforge dev: {exc}", file=sys.stderr)
        if embedded is not None:
            embedded.stop()
        return None
    return embedded, url, role_urls


def _child_environment(url: str, role_urls: dict[str, str]) -> dict[str, str]:
    # Children reach the same server by its URL and never start one themselves,
    # so this process is the embedded server's only user and stops it at the end.
    # Each child on its own role (issue 30): with the embedded server they get their roles'
    # URLs and not the owner's; with an external one, what QFORGE_*_DATABASE_URL say.
    env = {**os.environ, "QFORGE_DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
    if role_urls:
        del env["QFORGE_DATABASE_URL"]
        env.update({f"QFORGE_{setting.upper()}": value for setting, value in role_urls.items()})
    # The demo's http steps call services on this machine: allow loopback here
    # only (issue 19: an http step refuses non-public addresses by default).
    env.setdefault("QFORGE_HTTP_ALLOW", "127.0.0.0/8,::1,localhost")
    return env
