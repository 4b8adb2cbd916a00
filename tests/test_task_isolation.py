"""A shell step cannot become its worker: jobs posted to a real `qforge api`, run by a real `qforge worker --allow-shell`.

Each attack runs against a worker started as root (steps run as `nobody`) and
against one running as an unprivileged uid (steps run as that same uid, in a
user namespace). Root's home is 0700 here, so no other user can execute the
venv's Python: the unprivileged worker is a child of the test that imports the
worker's code first, then drops to the uid (os.setgid/os.setuid) and runs the
code already loaded (UNPRIVILEGED_WORKER below).

Every address a step connects to is a loopback listener of the test's own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cluster_procs import start_api
from qforge.events.states import JOB_FINISHED
from qforge.settings import Settings
from qforge.workers.executors import execute
from qforge.workers.host import IsolationError
from qforge.workers.isolation import Isolation
from qforge.workers.sandbox import TaskPolicy
from qforge.workers.secrets import Masker
from qforge.workers.tasks import TaskContext
from test_worker_support import FAST_ENV, QFORGE, Proc, Processes, process_running, procs, tasks_dir, wait_for  # noqa: F401

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"),
                                reason="needs root on Linux: steps run as other users, in namespaces")

UNPRIVILEGED_UID = 61_234  # no passwd entry needed
WORKER_SECRETS = {"QFORGE_API_TOKEN": "tok-5ecret-api", "QFORGE_AUDIT_SIGNING_KEY": "f" * 64}
SECRET_VALUE = "s3cr3t-value-4711"
DOTENV_SECRET = "dotenv-5ecret"
HOME_SECRET = "home-5ecret"

# Runs as root with the venv's Python, imports everything the worker uses, then becomes
# the uid and runs `qforge worker` from the modules already loaded.
UNPRIVILEGED_WORKER = textwrap.dedent('''
    import importlib, os, pkgutil, sys
    import asyncio.subprocess, ctypes.util, encodings.idna, logging.handlers
    import qforge
    for module in pkgutil.walk_packages(qforge.__path__, "qforge."):
        if not module.name.endswith("__main__") and not module.name.startswith("qforge.api"):
            importlib.import_module(module.name)
    import httpcore._async, httpcore._sync, anyio._backends._asyncio
    ctypes.CDLL(ctypes.util.find_library("c"))
    uid, cwd = int(sys.argv[1]), sys.argv[2]
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    os.chdir(cwd)
    sys.exit(qforge.cli.main(sys.argv[3:]))
''')


class Listener:
    """A TCP listener on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.accepted += 1
            connection.close()

    def close(self) -> None:
        self.socket.close()


class EchoHeaders:
    """An HTTP server on 127.0.0.1 that answers with the Authorization header it received."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        owner = self
        self.received: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                value = self.headers.get("Authorization", "")
                owner.received.append(value)
                body = f'{{"authorization": "{value}"}}'.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class SocketRelay:
    """A unix socket in a folder anyone may enter, relaying to the test server's socket (which lives
    in its 0700 data directory), so that a worker running as another uid can connect."""

    def __init__(self, url: str, folder: Path) -> None:
        info = conninfo_to_dict(url)
        self.url = url
        self.listener: socket.socket | None = None
        host, port = str(info.get("host") or ""), str(info.get("port") or "5432")
        if not host.startswith("/"):
            return  # a TCP server: any uid reaches it as it is
        folder.mkdir(mode=0o755)
        name = f".s.PGSQL.{port}"
        self.target = os.path.join(host, name)
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(folder / name))
        os.chmod(folder / name, 0o777)
        self.listener.listen(16)
        self.url = make_conninfo(url, host=str(folder))
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        assert self.listener is not None
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX)
            server.connect(self.target)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()


class Site:
    """The worker's own places, world-readable on purpose: only the isolation keeps them from a step."""

    def __init__(self, root: Path, owner: int) -> None:
        root.mkdir(mode=0o755)
        root.parent.chmod(0o755)
        self.root, self.uid = root, owner
        self.cwd, self.home, self.secrets = root / "worker-cwd", root / "worker-home", root / "secrets"
        for folder in (self.cwd, self.home):
            folder.mkdir(mode=0o755)
        self.secrets.mkdir(mode=0o700)
        (self.cwd / ".env").write_text(f"DEPLOY_KEY={DOTENV_SECRET}\n")
        (self.home / "credentials").write_text(f"{HOME_SECRET}\n")
        (self.secrets / "token").write_text(f"{SECRET_VALUE}\n")
        (root / "outside").write_text("not a secret\n")
        (self.secrets / "outward").symlink_to(root / "outside")
        for path in (self.cwd, self.home, self.secrets, *self.cwd.iterdir(), *self.home.iterdir(),
                     *self.secrets.iterdir()):
            os.chown(path, owner, owner)
            if path.is_file():
                path.chmod(0o644)


def spawn_worker(processes: Processes, site: Site, *, uid: int | None, queue: str, db_url: str,
                 env: dict[str, str]) -> Proc:
    full_env = {**{k: v for k, v in os.environ.items() if not k.startswith("QFORGE_")}, **FAST_ENV,
                **WORKER_SECRETS, "HOME": str(site.home), "QFORGE_SECRETS_DIR": str(site.secrets),
                "QFORGE_HTTP_ALLOW": "127.0.0.1", "QFORGE_DATABASE_URL": db_url, **env}
    args = ["worker", "--allow-shell", "--queues", queue, "--concurrency", "4", "--name", f"isolated-{queue}"]
    if uid is None:
        command = [str(QFORGE), *args]
    else:
        command = [sys.executable, "-c", UNPRIVILEGED_WORKER, str(uid), str(site.cwd), *args]
    log_path = processes.log_dir / f"worker-{queue}.log"
    with open(log_path, "wb") as log_file:
        popen = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=full_env, cwd=site.cwd)
    proc = Proc(popen, log_path, "worker")
    processes.started.append(proc)
    return proc


class Api:
    def __init__(self, base: str) -> None:
        self.client = httpx.Client(base_url=base, timeout=30)

    def post(self, queue: str, command: str, env: dict[str, Any] | None = None, **options: Any) -> str:
        payload: dict[str, Any] = {"command": command, **({"env": env} if env else {})}
        payload.update(options.pop("payload", {}))
        response = self.client.post("/jobs", json={"task": options.pop("task", "shell"), "queue": queue,
                                                   "payload": payload, "max_retries": 0, **options})
        assert response.status_code == 201, response.text
        return response.json()["id"]

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.client.get(f"/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def finished(self, job_id: str, timeout: float = 30) -> dict[str, Any]:
        return wait_for(lambda: (job := self.job(job_id))["status"] in JOB_FINISHED and job,
                        timeout=timeout, message=f"job {job_id} to finish")

    def events_text(self, job_id: str) -> str:
        response = self.client.get(f"/jobs/{job_id}/events")
        assert response.status_code == 200, response.text
        return response.text


def output(job: dict[str, Any]) -> str:
    result = job.get("result") or {}
    return f"{result.get('stdout', '')}\n{result.get('stderr', '')}\n{job.get('last_error') or ''}"



def marker() -> str:
    return f"{int.from_bytes(os.urandom(3), 'big') + 1_000_000}"


SNOOP = """
tr '\\0' '\\n' </proc/$PPID/environ; echo; cat /proc/*/environ | tr '\\0' '\\n'; echo
cat "$W_CWD/.env"; ls -A "$W_CWD" "$W_HOME"; cat "$W_HOME/credentials"; cat "$W_SECRETS/token"
echo "procs=$(ls /proc | grep -c '^[0-9]')"; echo "fds=$(ls /proc/self/fd | tr '\\n' ' ')"
echo "pwd=$(pwd)"; echo "home=$HOME"; echo "listing=$(ls -A | tr '\\n' ,)"; echo "uid=$(id -u)"
echo "cgroup=$(grep -c qforge- /proc/self/cgroup)"; echo end
"""
CONNECT = "bash -c 'echo hi >/dev/tcp/127.0.0.1/{port}' 2>/dev/null && echo connected || echo refused"




class Attack:
    """The jobs one worker is sent, and what must come of each."""

    def __init__(self, api: Api, queue: str, site: Site, listener: Listener, echo: EchoHeaders) -> None:
        self.api, self.queue, self.site, self.listener, self.echo = api, queue, site, listener, echo
        paths = {"W_CWD": str(site.cwd), "W_HOME": str(site.home), "W_SECRETS": str(site.secrets)}
        self.cancelled, self.timed_out = marker(), marker()
        post = functools.partial(api.post, queue)
        self.jobs = {
            "snoop": post(SNOOP, paths),
            "kill": post("kill -9 $PPID; kill -9 -1; sleep 0.2; echo still-here"),
            "cancel": post(f"setsid sleep {self.cancelled} & sleep {self.cancelled}"),
            "timeout": post(f"setsid sleep {self.timed_out} & sleep {self.timed_out}",
                            payload={"timeout_seconds": 1.5}),
            "offline": post(CONNECT.format(port=listener.port)),
            "echoed": post('echo "token=$TOKEN"; printf %s "$TOKEN" | wc -c', {"TOKEN": {"secret": "token"}}),
            "leaked": post('echo "it is $TOKEN" >&2; exit 3', {"TOKEN": {"secret": "token"}}),
            "traversal": post("true", {"TOKEN": {"secret": "../outside"}}),
            "missing": post("true", {"TOKEN": {"secret": "missing"}}),
            "symlink": post("true", {"TOKEN": {"secret": "outward"}}),
            "http": post("", task="http", payload={"command": None, "url": echo.url,
                                                   "headers": {"Authorization": {"secret": "token"}}}),
        }

    def cancel_and_time_out(self) -> None:
        """setsid children outlive neither a cancel nor a timeout."""
        api = self.api
        wait_for(lambda: process_running(f"sleep {self.cancelled}"), timeout=30, message="the step to run")
        assert api.client.post(f"/jobs/{self.jobs['cancel']}/cancel").status_code == 200
        assert api.finished(self.jobs["cancel"])["status"] == "cancelled"
        wait_for(lambda: not process_running(f"sleep {self.cancelled}"), timeout=15,
                 message="every process of the cancelled step (setsid too) to end")
        timed_out = api.finished(self.jobs["timeout"])
        assert timed_out["status"] == "dead" and "timed out" in timed_out["last_error"], timed_out
        wait_for(lambda: not process_running(f"sleep {self.timed_out}"), timeout=15,
                 message="every process of the timed-out step (setsid too) to end")

    def check(self, worker: Proc) -> None:
        api, unprivileged = self.api, self.site.uid != 0
        # The worker's environment, files and processes are out of reach.
        snoop = api.finished(self.jobs["snoop"])
        assert snoop["status"] == "succeeded", snoop
        seen = output(snoop)
        for secret in (*WORKER_SECRETS.values(), DOTENV_SECRET, HOME_SECRET, SECRET_VALUE, "QFORGE_"):
            assert secret not in seen
        lines = dict(line.split("=", 1) for line in snoop["result"]["stdout"].splitlines()
                     if line.split("=", 1)[0] in ("procs", "fds", "pwd", "home", "listing", "uid", "cgroup"))
        assert int(lines["procs"]) <= 5  # the step's own: init, its shell, ls, grep
        assert set(lines["fds"].split()) <= {"0", "1", "2", "3"}  # 3: ls reading the folder
        assert lines["pwd"] == lines["home"] and lines["listing"] == ""
        assert not Path(lines["pwd"]).exists()  # its folder, HOME too, is gone with it
        assert lines["uid"] == str(self.site.uid if unprivileged else 65534)
        assert ("cgroup v" in worker.log()) == (lines["cgroup"] != "0")

        # kill -9 $PPID (and -1) reach only the step's own processes.
        kill = api.finished(self.jobs["kill"])
        assert (kill["status"], kill["result"]["stdout"]) == ("succeeded", "still-here\n"), kill
        assert worker.alive()
        assert api.finished(api.post(self.queue, "echo after"))["result"]["stdout"] == "after\n"

        # Network none: a loopback listener of the test is out of reach.
        assert api.finished(self.jobs["offline"])["result"]["stdout"] == "refused\n"

        # Secrets: read when the step runs, masked everywhere they could come back.
        echoed = api.finished(self.jobs["echoed"])
        assert echoed["result"]["stdout"] == f"token=***\n{len(SECRET_VALUE)}\n", echoed
        assert echoed["payload"]["env"] == {"TOKEN": {"secret": "token"}}
        leaked = api.finished(self.jobs["leaked"])
        assert leaked["status"] == "dead" and leaked["result"]["stderr"] == "it is ***\n", leaked
        assert "it is ***" in leaked["last_error"]
        assert api.finished(self.jobs["http"])["result"] == {"authorization": "***"}
        refusals = {"traversal": "is not a file name", "missing": "no secret 'missing'",
                    "symlink": "points outside the secrets directory"}
        for name, message in refusals.items():
            refused = api.finished(self.jobs[name])
            assert refused["status"] == "dead" and message in refused["last_error"], refused
            assert "not a secret" not in refused["last_error"]
        for job_id in self.jobs.values():
            assert SECRET_VALUE not in api.events_text(job_id)
        assert SECRET_VALUE not in worker.log()


def test_a_shell_step_cannot_reach_its_worker(scratch_dir: Path, procs: Processes,
                                              conn: psycopg.Connection) -> None:
    """The same attacks on a root worker (steps as nobody) and an unprivileged one (steps as its uid)."""
    processes = procs
    sites = {"root": Site(scratch_dir / "root", 0),
             "unprivileged": Site(scratch_dir / "unprivileged", UNPRIVILEGED_UID)}
    listener, echo, api = Listener(), EchoHeaders(), None
    relay = SocketRelay(processes.db_url, scratch_dir / "pgsocket")
    try:
        workers = {queue: spawn_worker(processes, site, uid=site.uid or None, queue=queue, db_url=relay.url,
                                       env={"QFORGE_SHELL_NETWORK": "none"}) for queue, site in sites.items()}
        _, base = start_api(processes)  # meanwhile the workers start
        for proc in workers.values():
            wait_for(lambda: "shell steps run" in proc.log() or not proc.alive(), timeout=60,
                     message="the worker to start")
            assert proc.alive(), proc.log()
        api = Api(base)
        attacks = [Attack(api, queue, site, listener, echo) for queue, site in sites.items()]
        for attack in attacks:
            attack.cancel_and_time_out()
        for attack in attacks:
            attack.check(workers[attack.queue])
        assert listener.accepted == 0 and echo.received == [SECRET_VALUE, SECRET_VALUE]
        assert conn.execute("SELECT count(*) AS n FROM events WHERE data::text LIKE %s",
                            (f"%{SECRET_VALUE}%",)).fetchone()["n"] == 0

        # Not root, steps run as the worker's own uid: the worker is not dumpable, so even outside
        # a namespace its environment is root's alone; another process of that uid is readable.
        def read_environ(pid: str) -> subprocess.CompletedProcess:
            return subprocess.run(["setpriv", f"--reuid={UNPRIVILEGED_UID}", f"--regid={UNPRIVILEGED_UID}",
                                   "--clear-groups", "sh", "-c", f"cat /proc/{pid}/environ"],
                                  capture_output=True, text=True, timeout=10)
        denied = read_environ(str(workers["unprivileged"].pid))
        assert "Permission denied" in denied.stderr and "QFORGE_" not in denied.stdout
        assert read_environ("$$").returncode == 0
    finally:
        listener.close()
        echo.close()
        relay.close()
        if api is not None:
            api.client.close()


def test_the_attacks_are_real_without_isolation(tmp_path: Path) -> None:
    """Controls for the test above: the listener is reachable by a step on the host's network, and
    a setsid child outlives its cancelled step where nothing but the process group holds it."""
    listener = Listener()
    try:
        shell = TaskPolicy.from_settings(Settings(shell_cgroup="none"), shell=True)
        assert run_step(CONNECT.format(port=listener.port), shell)["stdout"] == "connected\n"
        assert listener.accepted == 1
    finally:
        listener.close()
    escaped, pid_file = marker(), tmp_path / "escaped.pid"
    with pytest.raises(TimeoutError):
        run_step(f"setsid sh -c 'echo $$ > {pid_file}; exec sleep {escaped}' & sleep {escaped}", TaskPolicy(),
                 timeout=1.0)
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=5,
                       message="the escaped child's pid"))
    try:
        assert process_running(f"sleep {escaped}")
    finally:
        os.kill(pid, signal.SIGKILL)


def run_step(command: str, policy: TaskPolicy, timeout: float | None = None) -> dict:
    ctx = TaskContext(job_id="control", attempt=1, task="shell", allow_shell=True, policy=policy)
    return asyncio.run(asyncio.wait_for(execute("shell", {"command": command}, ctx), timeout))


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_without_a_pid_namespace_the_cgroup_still_ends_a_setsid_child(version: str) -> None:
    """The fallback where unshare is refused: the step's cgroup (v1 here, or the v2 hierarchy
    mounted beside it, which delegates no controller: kill only) holds what setsid took out of
    the process group, and the limits land in it."""
    try:
        isolation = Isolation.from_settings(Settings(shell_cgroup=version, shell_max_memory_mb=256))
    except IsolationError as exc:
        pytest.skip(str(exc))
    assert isolation.cgroups is not None and isolation.cgroups.version == int(version[1])
    policy = TaskPolicy(isolation=dataclasses.replace(isolation, namespaces=False))
    escaped = marker()
    parents = " ".join(isolation.cgroups.parents)
    limits = ('for p in ' + parents + '; do for f in "$p"/qforge-*/memory.limit_in_bytes "$p"/qforge-*/pids.max;'
              ' do [ -e "$f" ] && echo "$(basename "$f")=$(cat "$f")"; done; done')
    result = run_step(f'setsid sleep {escaped} & echo "pid=$!"; {limits}; true', policy)
    values = dict(line.split("=", 1) for line in result["stdout"].splitlines())
    assert not process_running(f"sleep {escaped}")
    assert not Path(f"/proc/{values['pid']}/cmdline").exists() or b"sleep" not in Path(
        f"/proc/{values['pid']}/cmdline").read_bytes()
    if version == "v1":  # memory and pids are controllers of their own hierarchies here
        assert values["memory.limit_in_bytes"] == str(256 * 1024 * 1024) and values["pids.max"] == "1024"
    assert not any(os.path.exists(os.path.join(p, name)) for p in isolation.cgroups.parents
                   for name in os.listdir(p) if name.startswith(f"qforge-{os.getpid()}-"))


def test_a_worker_refuses_to_start_with_a_shell_user_it_cannot_be(db_url: str) -> None:
    env = {**os.environ, "QFORGE_SHELL_USER": "qforge-no-such-user"}
    done = subprocess.run([str(QFORGE), "worker", "--allow-shell", "--database-url", db_url], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "QFORGE_SHELL_USER=qforge-no-such-user: no such user" in done.stderr


def test_the_mask_covers_a_value_cut_by_the_tail_and_values_inside_json() -> None:
    masker = Masker()
    masker.add("hunter2-hunter2")
    assert masker.text("r2-hunter2 and hunter2-hunter2", cut_head=True) == "*** and ***"
    assert masker.text("r2-hunter2", cut_head=False) == "r2-hunter2"
    assert masker.json({"a": ["x hunter2-hunter2"], "hunter2-hunter2": 1}) == {"a": ["x ***"], "***": 1}
