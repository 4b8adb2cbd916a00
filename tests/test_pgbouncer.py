"""Behind PgBouncer (Debian's, started here) in transaction pooling mode, QFORGE_POOLER=transaction:
the API, two monitors and 3 workers of 200 slots each go through one PgBouncer whose pools hold 10
server connections each (pool_mode=transaction, default_pool_size=10). 5,000 jobs and 10 workflows
run, each job once (the task records every run), no process meets a "prepared statement" error,
no pool ever has more than 10 server connections (SHOW POOLS, polled throughout), and exactly one
monitor leads. Main case: LISTEN and the session locks on QFORGE_LISTEN_DATABASE_URL (direct);
then the fallback without it: polling (each process says so once), and leadership as a
transaction-level lock held open through the pooler, which passes on when its leader dies."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg import sql
from psycopg.rows import dict_row

from tests.conftest import fast_temp_base
from cluster_procs import Enqueuer, RetryingClient, assert_exactly_once, start_api, submit_diamonds, wait_all_done
from pgcluster import free_port, server_user
from qforge.db import ROLE_KINDS, role_name
from test_sse import SSEReader
from test_worker_support import Proc, Processes, tasks_dir, wait_for  # noqa: F401  (fixture)

PGBOUNCER = next((p for p in ("/usr/sbin/pgbouncer", shutil.which("pgbouncer")) if p and os.path.exists(p)), None)
pytestmark = pytest.mark.skipif(PGBOUNCER is None, reason="pgbouncer is not installed (Debian's package"
                                " pgbouncer: .ci/run installs it)")

POOL_SIZE = 10
PASSWORD = "bouncer-test-password"  # every role's in PgBouncer's auth_file (the test server trusts)
ADMIN = "qf_bouncer_admin"  # PgBouncer's admin console user (SHOW POOLS)
JOBS = 5_000
WORKFLOWS = 10
SLOTS = "200"

RECORDING_TASKS = '''
import os
import pwd

from qforge.workers.tasks import task


@task("pgb_record")
def pgb_record(payload, ctx):
    """Record every run (O_APPEND: one line per write, whole)."""
    with open(os.environ["QF_PGB_RUNS"], "a") as runs:
        runs.write(f"{payload['n']} {ctx.job_id}\\n")
    return None
'''


class Bouncer:
    """A PgBouncer in front of one database of the test server, on a free loopback port."""

    def __init__(self, server_url: str, dbname: str, folder: Path) -> None:
        server = conninfo_to_dict(server_url)
        self.dbname, self.port, self.folder = dbname, free_port(), folder
        self.target = {"host": server.get("host") or "127.0.0.1", "port": server.get("port") or "5432",
                       "dbname": dbname}
        folder.mkdir(mode=0o755)
        users = [role_name("qforge", kind) for kind in ROLE_KINDS] + [ADMIN]
        (folder / "users.txt").write_text("".join(f'"{user}" "{PASSWORD}"\n' for user in users))
        target = " ".join(f"{key}={value}" for key, value in self.target.items())
        (folder / "pgbouncer.ini").write_text(f"""[databases]
{dbname} = {target}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = {folder}/users.txt
admin_users = {ADMIN}
pool_mode = transaction
default_pool_size = {POOL_SIZE}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 1000
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
""")
        # PgBouncer refuses to run as root: as the user the test server runs as (the owner of its
        # socket's folder: the embedded server's, which others may not enter), else postgres.
        user = server_user()
        if user is not None and self.target["host"].startswith("/"):
            user = pwd.getpwuid(Path(self.target["host"]).stat().st_uid)
        run_as = {} if user is None else {"user": user.pw_uid, "group": user.pw_gid}
        for path in (folder, *folder.iterdir()):
            if user is not None:
                os.chown(path, user.pw_uid, user.pw_gid)
        self.proc = subprocess.Popen([str(PGBOUNCER), str(folder / "pgbouncer.ini")], cwd="/",
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, **run_as)
        wait_for(self._answers, timeout=15, message="PgBouncer to accept connections")
        self.max_servers: dict[str, int] = {}  # pool (user) -> the most server connections seen
        self._watching = threading.Event()
        self._watcher: threading.Thread | None = None

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"pgbouncer exited {self.proc.returncode}:\n{self.log()}")
        try:
            self.pools()
            return True
        except psycopg.OperationalError:
            return False

    def url(self, user: str | None = None) -> str:
        """A URL through PgBouncer (as `user`, else without a login: libpq takes PGUSER/the caller's)."""
        login = f"{user}:{PASSWORD}@" if user else ""
        return f"postgresql://{login}127.0.0.1:{self.port}/{self.dbname}"

    def direct_url(self) -> str:
        """The database itself, without a login (each process logs in as its own URL does)."""
        return make_conninfo(**self.target)

    def admin(self) -> psycopg.Connection:
        """PgBouncer's admin console (simple query protocol only: nothing prepared)."""
        return psycopg.connect(self.url(ADMIN).rsplit("/", 1)[0] + "/pgbouncer", autocommit=True,
                               connect_timeout=2, prepare_threshold=None, row_factory=dict_row)

    def pools(self) -> list[dict]:
        with self.admin() as admin:
            return admin.execute("SHOW POOLS").fetchall()

    def watch(self) -> None:
        """Poll SHOW POOLS every 50 ms until stop_watching(), keeping each pool's most servers."""
        def run() -> None:
            with self.admin() as admin:
                while not self._watching.wait(0.05):
                    for pool in admin.execute("SHOW POOLS").fetchall():
                        if pool["database"] != self.dbname:
                            continue
                        servers = sum(pool[k] for k in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login"))
                        self.max_servers[pool["user"]] = max(self.max_servers.get(pool["user"], 0), servers)

        self._watcher = threading.Thread(target=run, daemon=True)
        self._watcher.start()

    def stop_watching(self) -> dict[str, int]:
        self._watching.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        return self.max_servers

    def log(self) -> str:
        try:
            return (self.folder / "pgbouncer.log").read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        self.stop_watching()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def bouncer(server_url: str, db_url: str) -> Iterator[Bouncer]:
    dbname = conninfo_to_dict(db_url)["dbname"]
    with psycopg.connect(db_url, autocommit=True) as conn:  # an external test server may ask for them
        for kind in ROLE_KINDS:
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                sql.Identifier(role_name("qforge", kind)), sql.Literal(PASSWORD)))
    # Not under tmp_path: pytest keeps that 0700, and PgBouncer runs as another user.
    base = Path(tempfile.mkdtemp(prefix="qforge-pgbouncer-", dir=fast_temp_base()))
    base.chmod(0o755)
    built = Bouncer(server_url, dbname, base / "pgbouncer")
    try:
        yield built
    finally:
        built.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def behind(bouncer: Bouncer, tmp_path: Path, tasks_dir: Path) -> Iterator[Processes]:  # noqa: F811
    """Processes whose every URL goes through the bouncer (each on its role, with the test password)."""
    (tasks_dir / "qf_pgb_tasks.py").write_text(RECORDING_TASKS)
    processes = Processes(bouncer.url(), tmp_path, tasks_dir)
    try:
        yield processes
    finally:
        processes.close()
        print(processes.logs())  # pytest shows captured output only for failing tests
        print(bouncer.log()[-5000:])


def _env(tmp_path: Path, listen_url: str | None) -> dict[str, str]:
    # The default stale limit rather than the other process tests' 2 s: "each job ran once" is about
    # the pooler, and on a loaded 2-core machine 600 slots can miss a 2 s heartbeat, and the
    # monitor then rightly runs the job again.
    env = {"QFORGE_POOLER": "transaction", "PGPASSWORD": PASSWORD, "QF_PGB_RUNS": str(tmp_path / "runs.txt"),
           "QFORGE_LOG_PACK_SECONDS": "0", "QFORGE_HEARTBEAT_SECONDS": "2", "QFORGE_STALE_SECONDS": "30"}
    if listen_url:
        env["QFORGE_LISTEN_DATABASE_URL"] = listen_url
    return env


def _start(processes: Processes, env: dict[str, str], workers: int, slots: str) -> tuple[str, list[Proc]]:
    api, base = start_api(processes, env)
    monitors = [processes.monitor(env) for _ in range(2)]
    for _ in range(workers):
        processes.worker("--concurrency", slots, "--tasks", "qf_pgb_tasks", env=env)
    return base, monitors


def _drain(base: str, jobs: int, workflows: int, prefix: str) -> tuple[dict[int, str], list[str], float]:
    """Submit through the API while an SSE subscriber (the API's event hub) follows the log."""
    started = time.monotonic()
    reader = SSEReader(base)
    enqueuer = Enqueuer(base, 0, jobs, threads=8, prefix=prefix, task="pgb_record")
    client = RetryingClient(base)
    try:
        submitted = submit_diamonds(client, prefix, workflows)
    finally:
        client.close()
    enqueuer.join(timeout=120)
    enqueuer.close()
    try:
        assert len(reader.take(jobs, timeout=60)) == jobs  # at least their Enqueued events
    finally:
        reader.close()
    print(f"{jobs} jobs and {workflows} workflows submitted in {time.monotonic() - started:.1f}s")
    return enqueuer.acknowledged, submitted, started


def _assert_ran_once(tmp_path: Path, db_url: str, acknowledged: dict[int, str], jobs: int,
                     workflows: list[str]) -> None:
    assert_exactly_once(db_url, acknowledged, jobs, workflows)
    runs = [line.split() for line in (tmp_path / "runs.txt").read_text().splitlines()]
    assert len(runs) == jobs and {int(n) for n, _ in runs} == set(range(jobs)), "a job ran twice or never"
    assert {job for _, job in runs} == set(acknowledged.values())


def _leaders(monitors: list[Proc]) -> list[Proc]:
    return [m for m in monitors if "is the leader" in m.log()]


def _wait_one_leader(monitors: list[Proc]) -> None:
    wait_for(lambda: len(_leaders(monitors)) == 1 and all("another monitor leads" in m.log() or "is the leader"
                                                          in m.log() for m in monitors),
             timeout=60, message="one monitor to lead and the other to wait")


def _assert_clean(processes: Processes, bouncer: Bouncer) -> None:
    logs = processes.logs() + bouncer.log()
    assert "prepared statement" not in logs
    assert "unexpected database error" not in logs


def test_behind_pgbouncer_with_a_direct_listen_url_runs_every_job_once_within_the_pool(
        bouncer: Bouncer, behind: Processes, db_url: str, tmp_path: Path) -> None:
    env = _env(tmp_path, bouncer.direct_url())
    base, monitors = _start(behind, env, 3, SLOTS)
    _wait_one_leader(monitors)
    bouncer.watch()
    acknowledged, workflows, started = _drain(base, JOBS, WORKFLOWS, "pgb")
    wait_all_done(db_url, WORKFLOWS, timeout=120)
    seconds = time.monotonic() - started
    pools = bouncer.stop_watching()
    print(f"{JOBS} jobs + {WORKFLOWS} workflows through PgBouncer in {seconds:.1f}s; most server connections"
          f" per pool: {pools}")
    _assert_ran_once(tmp_path, db_url, acknowledged, JOBS, workflows)
    assert pools[role_name("qforge", "worker")] >= 1 and max(pools.values()) <= POOL_SIZE, pools
    assert len(_leaders(monitors)) == 1
    _assert_clean(behind, bouncer)
    assert "instead of LISTEN" not in behind.logs()


def test_behind_pgbouncer_without_a_direct_url_polls_and_still_elects_one_leader(
        bouncer: Bouncer, behind: Processes, db_url: str, tmp_path: Path) -> None:
    env = _env(tmp_path, None)
    base, monitors = _start(behind, env, 2, "50")
    _wait_one_leader(monitors)
    bouncer.watch()
    acknowledged, workflows, _ = _drain(base, 500, 2, "pgb-poll")
    wait_all_done(db_url, 2, timeout=60)
    pools = bouncer.stop_watching()
    _assert_ran_once(tmp_path, db_url, acknowledged, 500, workflows)
    assert max(pools.values()) <= POOL_SIZE, pools
    for proc in behind.started:
        if proc.kind in ("api", "worker"):
            assert "instead of LISTEN" in proc.log() and "polls every 0.5s" in proc.log(), proc.log()
    # The leader's transaction-level lock goes with it: the other monitor takes over.
    [leader] = _leaders(monitors)
    [other] = [m for m in monitors if m is not leader]
    leader.signal(signal.SIGKILL)
    other.wait_log("is the leader", timeout=30)
    _assert_clean(behind, bouncer)

