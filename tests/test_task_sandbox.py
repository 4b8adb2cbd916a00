"""Tasks cannot read the server's secrets nor reach what trusts this machine: shell environment and limits, http destinations.

Every address a test sends to is a loopback listener of its own (127.0.0.2 plays
the refused host); private, link-local and metadata addresses are only classified.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import psycopg
import pydantic
import pytest

from qforge.settings import Settings
from qforge.workers.executors import TaskError, execute
from qforge.workers.sandbox import TaskPolicy, address_kind
from qforge.workers.tasks import TaskContext
from test_worker_support import add_jobs, procs, tasks_dir, wait_for  # noqa: F401  (fixtures)

SECRETS = {"QFORGE_API_TOKEN": "tok-5ecret-api", "QFORGE_DATABASE_URL": "postgresql://u:pw-5ecret@h/db",
           "AWS_SECRET_ACCESS_KEY": "aws-5ecret-key"}


def run(task: str, payload: dict, policy: TaskPolicy = TaskPolicy()) -> object:
    ctx = TaskContext(job_id=str(uuid.uuid4()), attempt=1, task=task, allow_shell=True, policy=policy)
    return asyncio.run(execute(task, payload, ctx))


# --------------------------------------------------------------------------- shell


def test_a_real_worker_keeps_its_secrets_out_of_a_shell_steps_output(conn: psycopg.Connection,
                                                                      procs) -> None:  # noqa: F811
    (job_id,) = add_jobs(conn, {"task": "shell", "payload": {"command": "env; echo done"}, "max_retries": 0})
    procs.worker("--allow-shell", "--name", "sandboxed", env={**SECRETS, "QF_VISIBLE": "shown",
                                                              "QFORGE_SHELL_ENV_ALLOW": "QF_VISIBLE"})
    wait_for(lambda: conn.execute("SELECT status FROM jobs WHERE id = %s", (job_id,)).fetchone()["status"]
             == "succeeded", timeout=20, message="the env step to finish")
    stdout = conn.execute("SELECT result ->> 'stdout' AS out FROM jobs WHERE id = %s", (job_id,)).fetchone()["out"]
    names = {line.split("=", 1)[0] for line in stdout.splitlines() if "=" in line}
    assert "PATH" in names and "QF_VISIBLE=shown" in stdout
    assert not {name for name in names if name.startswith("QFORGE_")}
    logged = conn.execute("SELECT string_agg(data::text, ' ') AS all FROM events").fetchone()["all"]
    for secret in SECRETS.values():
        assert secret not in logged


def test_a_shell_step_sees_only_the_base_the_allowed_and_its_own_variables(monkeypatch) -> None:
    for name, value in {**SECRETS, "HOME": "/home/w", "LANG": "C.UTF-8", "TZ": "UTC", "EXTRA": "x"}.items():
        monkeypatch.setenv(name, value)
    result = run("shell", {"command": "env", "env": {"MINE": "1"}}, TaskPolicy(shell_env_allow=("EXTRA",)))
    names = {line.split("=", 1)[0] for line in result["stdout"].splitlines()}
    assert names - {"PWD", "SHLVL", "_", "OLDPWD"} == {"PATH", "HOME", "LANG", "TZ", "EXTRA", "MINE"}


def test_qforge_variables_cannot_be_allowed_into_tasks() -> None:
    with pytest.raises(pydantic.ValidationError, match="QFORGE_"):
        Settings(shell_env_allow="PATH_EXTRA,QFORGE_DATABASE_URL")
    assert Settings(shell_env_allow=" A , B ,").shell_env_names == ["A", "B"]
    assert TaskPolicy(shell_env_allow=("qforge_api_token",)).shell_environment(
        {}, {"qforge_api_token": "x", "PATH": "/bin"}) == {"PATH": "/bin"}


def test_the_memory_limit_stops_a_greedy_command() -> None:
    greedy = f'"{sys.executable}" -c "x = bytearray(400 * 1024 * 1024); print(len(x))"'
    assert run("shell", {"command": greedy})["stdout"].strip() == str(400 * 1024 * 1024)
    with pytest.raises(TaskError) as refused:
        run("shell", {"command": greedy}, TaskPolicy(shell_max_memory_mb=200))
    assert "MemoryError" in refused.value.result["stderr"]


def test_the_cpu_limit_stops_a_spinning_command() -> None:
    with pytest.raises(TaskError) as stopped:
        run("shell", {"command": "while :; do :; done", "timeout_seconds": 60},
            TaskPolicy(shell_max_cpu_seconds=1))
    assert stopped.value.reason != "timeout"
    assert "SIGXCPU" in stopped.value.message or "SIGKILL" in stopped.value.message


def test_limits_apply_to_the_command_not_to_the_arguments_it_sees() -> None:
    result = run("shell", {"command": 'ulimit -t; ulimit -v; echo "$0|$#"'},
                 TaskPolicy(shell_max_memory_mb=512, shell_max_cpu_seconds=30))
    assert result["stdout"].split() == ["30", str(512 * 1024), "/bin/sh|0"]


# --------------------------------------------------------------------------- http


class Listener:
    """A loopback HTTP server that records what reaches it; /redirect?to=URL&code=N redirects."""

    def __init__(self, host: str) -> None:
        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else ""
                owner.requests.append({"method": self.command, "path": self.path, "body": body,
                                       "host": self.headers.get("Host")})
                if self.path.startswith("/redirect"):
                    target, _, code = self.path.partition("?to=")[2].partition("&code=")
                    self.send_response(int(code or 302))
                    self.send_header("Location", target)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = json.dumps({"method": self.command, "body": body,
                                   "host": self.headers.get("Host")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def allowed() -> Iterator[Listener]:
    listener = Listener("127.0.0.1")
    yield listener
    listener.close()


@pytest.fixture
def refused_host() -> Iterator[Listener]:
    listener = Listener("127.0.0.2")
    yield listener
    listener.close()


LOOPBACK_ONE = TaskPolicy(http_allow=("127.0.0.1",))


def test_an_http_step_to_loopback_is_refused_by_default(allowed: Listener) -> None:
    with pytest.raises(TaskError, match="loopback") as refused:
        run("http", {"url": f"{allowed.url}/x"})
    assert refused.value.reason == "refused"
    assert allowed.requests == []


def test_an_http_step_to_loopback_works_when_allowed(allowed: Listener) -> None:
    assert run("http", {"url": f"{allowed.url}/x"}, LOOPBACK_ONE)["method"] == "GET"
    assert run("http", {"url": f"{allowed.url}/x"}, TaskPolicy(http_allow=("127.0.0.0/30",)))["method"] == "GET"


def test_an_allowed_host_name_is_called_by_its_checked_address_with_its_own_host_header(
        allowed: Listener) -> None:
    answer = run("http", {"url": f"http://localhost:{allowed.port}/x"}, TaskPolicy(http_allow=("localhost",)))
    assert answer["host"] == f"localhost:{allowed.port}"
    with pytest.raises(TaskError, match="loopback"):
        run("http", {"url": f"http://localhost:{allowed.port}/x"}, TaskPolicy(http_allow=("example.org",)))


def test_a_redirect_from_an_allowed_host_to_a_refused_one_is_refused(allowed: Listener,
                                                                     refused_host: Listener) -> None:
    with pytest.raises(TaskError, match="127.0.0.2"):
        run("http", {"url": f"{allowed.url}/redirect?to={refused_host.url}/secret"}, LOOPBACK_ONE)
    assert [r["path"].split("?")[0] for r in allowed.requests] == ["/redirect"]
    assert refused_host.requests == []  # never contacted


def test_redirects_within_allowed_hosts_are_followed_with_the_method_rules(allowed: Listener) -> None:
    hop = f"{allowed.url}/redirect?to={allowed.url}/end&code="
    assert run("http", {"url": hop + "303", "json": {"a": 1}}, LOOPBACK_ONE) == {
        "method": "GET", "body": "", "host": f"127.0.0.1:{allowed.port}"}
    assert run("http", {"url": hop + "302", "json": {"a": 1}}, LOOPBACK_ONE)["method"] == "GET"
    kept = run("http", {"url": hop + "307", "json": {"a": 1}}, LOOPBACK_ONE)
    assert (kept["method"], json.loads(kept["body"])) == ("POST", {"a": 1})
    put = run("http", {"url": hop + "308", "method": "PUT", "json": {"b": 2}}, LOOPBACK_ONE)
    assert (put["method"], json.loads(put["body"])) == ("PUT", {"b": 2})


def test_a_redirect_loop_ends_after_ten_hops(allowed: Listener) -> None:
    with pytest.raises(TaskError, match="more than 10 redirects"):
        run("http", {"url": f"{allowed.url}/redirect?to=/redirect"}, LOOPBACK_ONE)
    assert len(allowed.requests) == 11


@pytest.mark.parametrize("address,kind", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"), ("fd00:ec2::254", "private"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"), ("0.0.0.0", "unspecified"),
    ("100.64.0.1", "reserved"), ("224.0.0.1", "multicast"),
    ("93.184.216.34", None), ("2606:4700:4700::1111", None),
])
def test_addresses_are_classified_without_contacting_them(address: str, kind: str | None) -> None:
    found = address_kind(ipaddress.ip_address(address))
    assert (found is None) if kind is None else found.startswith(kind), (address, found)


def test_an_allowed_range_admits_its_addresses_only() -> None:
    policy = TaskPolicy(http_allow=("10.0.0.0/8", "build.internal"))
    assert policy.refusal("svc", ipaddress.ip_address("10.9.8.7")) is None
    assert "private" in policy.refusal("svc", ipaddress.ip_address("192.168.0.1"))
    assert policy.refusal("build.internal", ipaddress.ip_address("192.168.0.1")) is None
    assert policy.refusal("example.org", ipaddress.ip_address("93.184.216.34")) is None
    with pytest.raises(pydantic.ValidationError):
        Settings(http_allow="10.0.0.0/33")


def test_a_worker_refuses_to_start_when_told_to_pass_a_qforge_variable_to_tasks(db_url: str) -> None:
    env = {**os.environ, "QFORGE_SHELL_ENV_ALLOW": "HTTP_PROXY,QFORGE_DATABASE_URL"}
    started = subprocess.run([sys.executable, "-m", "qforge.cli", "worker", "--database-url", db_url,
                              "--allow-shell"], capture_output=True, text=True, timeout=60, env=env)
    assert started.returncode == 2
    assert "QFORGE_SHELL_ENV_ALLOW" in started.stderr and "Traceback" not in started.stderr
