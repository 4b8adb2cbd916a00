"""A drain through PgBouncer (transaction pooling, QFORGE_POOLER=transaction) against the same drain
direct, in one run: workers started and waiting, N no-op jobs enqueued in one transaction, the
clock runs until the last one succeeded. Alternating direct / PgBouncer, --repeat rounds, medians;
with the most server and client connections each pool had (SHOW POOLS every 50 ms).

    python bench/qf_pgbouncer.py --database-url postgresql://postgres@127.0.0.1:5432/postgres

The server must trust the local connections (PgBouncer logs in without a password here). Debian's
PgBouncer (/usr/sbin/pgbouncer) is started on a free port with a config in a temp folder, as the
postgres user when run as root.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from common import recreate, summarize  # noqa: E402

QFORGE = Path(sys.executable).parent / "qforge"
DBNAME = "qf_bench_pgbouncer"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_bouncer(folder: Path, server: dict, user: str, pool_size: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    (folder / "users.txt").write_text(f'"{user}" ""\n"pgb_admin" ""\n')
    (folder / "pgbouncer.ini").write_text(
        f"[databases]\n{DBNAME} = host={server.get('host', '127.0.0.1')} port={server.get('port', '5432')}"
        f" dbname={DBNAME}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder}/users.txt\nadmin_users = pgb_admin\npool_mode = transaction\n"
        f"default_pool_size = {pool_size}\nreserve_pool_size = 0\nmax_client_conn = 1000\n"
        f"logfile = {folder}/pgbouncer.log\npidfile = {folder}/pgbouncer.pid\n")
    run_as = {}
    if os.geteuid() == 0:  # PgBouncer refuses root
        owner = pwd.getpwnam("postgres")
        run_as = {"user": owner.pw_uid, "group": owner.pw_gid}
        for path in (folder, *folder.iterdir()):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    binary = "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else shutil.which("pgbouncer")
    proc = subprocess.Popen([str(binary), str(folder / "pgbouncer.ini")], cwd="/", stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, **run_as)
    deadline = time.monotonic() + 10
    while True:
        try:
            admin(port).close()
            return proc, port
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def admin(port: int) -> psycopg.Connection:
    return psycopg.connect(f"postgresql://pgb_admin@127.0.0.1:{port}/pgbouncer", autocommit=True,
                           prepare_threshold=None, row_factory=dict_row)


class PoolWatch:
    """The most server (sv_*) and active client connections of each pool, SHOW POOLS every 50 ms."""

    def __init__(self, port: int) -> None:
        self.port, self.most = port, {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        with admin(self.port) as conn:
            while not self.stopping.wait(0.05):
                for pool in conn.execute("SHOW POOLS").fetchall():
                    if pool["database"] != DBNAME:
                        continue
                    servers = sum(pool[k] for k in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login"))
                    seen = self.most.setdefault(pool["user"], {"servers": 0, "clients": 0, "waiting": 0})
                    seen["servers"] = max(seen["servers"], servers)
                    seen["clients"] = max(seen["clients"], pool["cl_active"] + pool["cl_waiting"])
                    seen["waiting"] = max(seen["waiting"], pool["cl_waiting"])

    def stop(self) -> dict:
        self.stopping.set()
        self.thread.join(timeout=5)
        return self.most


def drain(direct: str, worker_url: str, env: dict[str, str], args: argparse.Namespace, logs: Path) -> float:
    """Seconds from the commit of N jobs to the last one's success, workers started beforehand."""
    from qforge.commands.enqueue import JobSpec, enqueue

    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute("VACUUM jobs")
        before = conn.execute("SELECT count(*) FROM jobs WHERE status = 'succeeded'").fetchone()[0]
    workers, paths = [], []
    for n in range(args.workers):
        paths.append(logs / f"worker-{len(list(logs.iterdir()))}.log")
        with open(paths[-1], "wb") as log:
            workers.append(subprocess.Popen(
                [str(QFORGE), "worker", "--database-url", worker_url, "--concurrency", str(args.concurrency),
                 "--tasks", "qf_tasks", "--name", f"bench-{n}"], env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        deadline = time.monotonic() + 60
        while not all(" started: queues" in path.read_text() for path in paths):  # registered
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not start within 60 s")
            time.sleep(0.05)
        time.sleep(args.settle)  # and listening
        with psycopg.connect(direct, autocommit=True) as conn:
            with conn.transaction():
                enqueue(conn, [JobSpec(task="bench_noop") for _ in range(args.jobs)], actor="bench")
            started = time.monotonic()
            while conn.execute("SELECT count(*) FROM jobs WHERE status = 'succeeded'").fetchone()[0] < before + args.jobs:
                if time.monotonic() - started > 300:
                    raise RuntimeError("the drain took over 300 s")
                time.sleep(0.02)
            return time.monotonic() - started
    finally:
        for proc in workers:
            proc.terminate()
        for proc in workers:
            proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres",
                        help="admin URL of a server that trusts local connections")
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--pool-size", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--settle", type=float, default=0.5, help="seconds the started workers get to LISTEN")
    args = parser.parse_args()

    from qforge.migrate import migrate

    direct = recreate(args.database_url, DBNAME)
    with psycopg.connect(direct, autocommit=True) as conn:
        migrate(conn)
    server = conninfo_to_dict(direct)
    base_env = {**os.environ, "PYTHONPATH": str(BENCH_DIR), "QFORGE_LOG_PACK_SECONDS": "0"}
    for name in [k for k in base_env if k.startswith("QFORGE_")]:
        if name not in ("QFORGE_LOG_PACK_SECONDS",):
            del base_env[name]
    seconds: dict[str, list[float]] = {"direct": [], "pgbouncer": []}
    with tempfile.TemporaryDirectory(prefix="qf-pgbouncer-") as scratch:
        folder = Path(scratch)
        folder.chmod(0o755)
        logs = folder / "logs"
        logs.mkdir()
        proc, port = start_bouncer(folder, server, server.get("user", "postgres"), args.pool_size)
        pooled = f"postgresql://{server.get('user', 'postgres')}@127.0.0.1:{port}/{DBNAME}"
        pooler_env = {**base_env, "QFORGE_POOLER": "transaction", "QFORGE_LISTEN_DATABASE_URL": direct}
        pools: dict = {}
        try:
            for turn in range(args.repeat):
                order = ["direct", "pgbouncer"] if turn % 2 == 0 else ["pgbouncer", "direct"]
                for where in order:
                    if where == "direct":
                        seconds[where].append(drain(direct, direct, base_env, args, logs))
                    else:
                        watch = PoolWatch(port)
                        seconds[where].append(drain(direct, pooled, pooler_env, args, logs))
                        for user, most in watch.stop().items():
                            pools[user] = {k: max(v, pools.get(user, {}).get(k, 0)) for k, v in most.items()}
                    print(f"round {turn + 1} {where}: {args.jobs / seconds[where][-1]:,.0f} jobs/s", file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    rates = {where: summarize([args.jobs / s for s in values]) for where, values in seconds.items()}
    print(json.dumps({
        "jobs": args.jobs, "workers": args.workers, "concurrency": args.concurrency, "pool_size": args.pool_size,
        "jobs_per_second": rates,
        "ratio_pgbouncer_to_direct": rates["pgbouncer"]["median"] / rates["direct"]["median"],
        "most_connections_per_pool": pools,
    }, indent=1))


if __name__ == "__main__":
    main()
