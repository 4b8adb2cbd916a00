"""A real Patroni cluster for the failover tests: one etcd and two Patroni nodes (Debian's `patroni` and
`etcd-server`), PostgreSQL from the machine's binaries, synchronous mode, all on loopback, all in a
throwaway folder.

Each Patroni runs as the PostgreSQL user (PostgreSQL refuses root) in a session of its own. The
settings that matter for QForge are the ones the docs name: `synchronous_mode` (a commit is
acknowledged only once the synchronous standby has it, so the standby Patroni promotes holds every
acknowledged job) and `maximum_lag_on_failover`; `master_start_timeout: 0` makes a crashed primary's
Patroni hand over at once instead of trying to restart it in place, and `use_pg_rewind` lets the old
primary rejoin as a replica.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest
import yaml

from pgcluster import _base_folder, _chown, _run_as, find_bindir, free_port, kill_group, log_tail, server_user

# Patroni's clock: a leader key lives TTL seconds, every node looks LOOP_WAIT seconds apart, and
# retries the DCS and PostgreSQL for RETRY_TIMEOUT (Patroni wants loop_wait + 2 * retry <= ttl).
TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 1, 4


def require_patroni() -> Path:
    """The PostgreSQL binaries, or a skip naming what this machine lacks."""
    for tool in ("patroni", "etcd"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (Debian's patroni and etcd-server; .ci/run installs them)")
    bindir = find_bindir()
    if bindir is None or not (bindir / "pg_rewind").exists():
        pytest.skip("no PostgreSQL binaries with pg_rewind on this machine")
    if os.geteuid() == 0 and server_user() is None:
        pytest.skip("running as root without a postgres user to run PostgreSQL as")
    return bindir


class Etcd:
    """One etcd member on loopback (the DCS Patroni keeps its leader key in)."""

    def __init__(self, folder: Path) -> None:
        self.client_port, peer_port = free_port(), free_port()
        data = folder / "etcd"
        data.mkdir()
        self.log_path = folder / "etcd.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                ["etcd", "--name", "e1", "--data-dir", str(data),
                 "--listen-client-urls", f"http://127.0.0.1:{self.client_port}",
                 "--advertise-client-urls", f"http://127.0.0.1:{self.client_port}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                 "--initial-cluster", f"e1=http://127.0.0.1:{peer_port}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while not _http_ok(f"http://127.0.0.1:{self.client_port}/health"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        kill_group(self.process)


def _http_ok(url: str, timeout: float = 2) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


class Node:
    """One Patroni node and the PostgreSQL it manages."""

    def __init__(self, folder: Path, name: str, bindir: Path, etcd: Etcd) -> None:
        self.name, self.folder = name, folder / name
        self.folder.mkdir()
        _chown(self.folder)
        self.port, self.api_port = free_port(), free_port()
        self.datadir = self.folder / "data"
        self.log_path = self.folder / "patroni.log"
        config = {
            "scope": "qforge-test", "name": name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{self.api_port}", "connect_address": f"127.0.0.1:{self.api_port}"},
            "etcd3": {"hosts": [f"127.0.0.1:{etcd.client_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL, "loop_wait": LOOP_WAIT, "retry_timeout": RETRY_TIMEOUT,
                    "synchronous_mode": True,
                    # Never promote a replica that is behind: with synchronous_mode the sync
                    # standby is never behind what was acknowledged; this guards the others.
                    "maximum_lag_on_failover": 1048576,
                    "master_start_timeout": 0,
                    "postgresql": {
                        "use_pg_rewind": True, "use_slots": True,
                        "parameters": {"wal_log_hints": "on", "max_connections": 200,
                                       "shared_buffers": "64MB", "wal_retrieve_retry_interval": "100ms",
                                       "fsync": "off", "full_page_writes": "on"}},
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, "data-checksums"],
                "pg_hba": ["host all all 127.0.0.1/32 trust", "host replication all 127.0.0.1/32 trust",
                           "local all all trust"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.port}", "connect_address": f"127.0.0.1:{self.port}",
                "data_dir": str(self.datadir), "bin_dir": str(bindir),
                "pgpass": str(self.folder / "pgpass"),
                "authentication": {"superuser": {"username": "postgres", "password": "postgres"},
                                   "replication": {"username": "postgres", "password": "postgres"},
                                   "rewind": {"username": "postgres", "password": "postgres"}},
                "parameters": {"unix_socket_directories": str(self.folder)},
            },
        }
        self.config_path = self.folder / "patroni.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        _chown(self.config_path)
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab")
        _chown(self.log_path)
        self.process = subprocess.Popen(["patroni", str(self.config_path)], stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True, cwd=str(self.folder),
                                        env={**os.environ, "LC_ALL": "C.UTF-8", "HOME": str(self.folder)},
                                        **_run_as())
        log.close()

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def is_primary(self) -> bool:
        return _http_ok(f"http://127.0.0.1:{self.api_port}/primary")

    def is_sync_standby(self) -> bool:
        return _http_ok(f"http://127.0.0.1:{self.api_port}/sync")

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.datadir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill_postgres(self) -> None:
        """SIGKILL this node's PostgreSQL, postmaster and backends (its Patroni lives on)."""
        pid = self.postmaster_pid()
        if pid is None:
            raise RuntimeError(f"{self.name} has no running PostgreSQL")
        backends = _children(pid)
        if os.getpgid(pid) != os.getpgid(self.process.pid):
            os.killpg(os.getpgid(pid), signal.SIGKILL)  # Patroni started it in a group of its own
        else:
            os.kill(pid, signal.SIGKILL)
        for child in backends:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def log(self) -> str:
        return log_tail(self.log_path)

    def stop(self) -> None:
        kill_group(self.process)
        pid = self.postmaster_pid()
        if pid is not None:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


class PatroniCluster:
    """etcd and two Patroni nodes; `leader()` names the node that leads now."""

    def __init__(self) -> None:
        bindir = require_patroni()
        self.folder = _base_folder()
        self.etcd = Etcd(self.folder)
        self.nodes = [Node(self.folder, f"node{n}", bindir, self.etcd) for n in (1, 2)]
        try:
            self.nodes[0].start()
            self.wait(lambda: self.nodes[0].is_primary(), 60, "node1 to bootstrap as the leader")
            self.nodes[1].start()
            self.wait(lambda: self.nodes[1].is_sync_standby(), 90, "node2 to become the synchronous standby")
        except BaseException:
            self.close()
            raise

    def wait(self, predicate, timeout: float, message: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {message}\n"
                                     + "\n".join(f"--- {n.name} ---\n{n.log()}" for n in self.nodes))
            time.sleep(0.1)

    def leader(self) -> Node | None:
        """The node that is primary now (None in the moment between two leaders)."""
        return next((node for node in self.nodes if node.is_primary()), None)

    def multi_host_url(self, dbname: str) -> str:
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.nodes[0].api_port}/cluster", timeout=5) as response:
            return json.loads(response.read())

    def sql(self, statement: str, dbname: str = "postgres") -> None:
        leader = self.leader()
        assert leader is not None, "no leader"
        with psycopg.connect(leader.url(dbname), autocommit=True) as conn:
            conn.execute(statement)

    def close(self) -> None:
        for node in self.nodes:
            node.stop()
        self.etcd.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
