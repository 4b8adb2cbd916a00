"""Executors and the task registry: built-ins, user tasks, shell and http, without a database."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from qforge.workers.executors import TaskError, execute
from qforge.workers.payloads import OUTPUT_TAIL_BYTES
from qforge.workers.sandbox import TaskPolicy
from qforge.workers.tasks import TaskContext, get_task, load_task_modules, task

# The http tests here call a loopback listener of their own (tests/test_task_sandbox.py
# checks that loopback is refused without this).
LOOPBACK_ALLOWED = TaskPolicy(http_allow=("127.0.0.1",))


def make_ctx(task_name: str = "t", *, attempt: int = 1, allow_shell: bool = False,
             policy: TaskPolicy = LOOPBACK_ALLOWED) -> TaskContext:
    return TaskContext(job_id=str(uuid.uuid4()), attempt=attempt, task=task_name, allow_shell=allow_shell,
                       policy=policy)


def run(task_name: str, payload: dict, **ctx_options) -> object:
    return asyncio.run(execute(task_name, payload, make_ctx(task_name, **ctx_options)))


def shell(command: str, **payload) -> dict:
    return run("shell", {"command": command, **payload}, allow_shell=True)


# --- built-ins ------------------------------------------------------------------


def test_echo_returns_its_payload():
    assert run("echo", {"x": [1, "two"], "y": None}) == {"x": [1, "two"], "y": None}


def test_add_sums_numbers():
    assert run("add", {"a": 2, "b": 3.5}) == 5.5


@pytest.mark.parametrize("payload", [{}, {"a": 1}, {"a": "1", "b": 2}, {"a": True, "b": 2}])
def test_add_rejects_missing_or_non_numeric_operands(payload):
    with pytest.raises(TaskError, match="add needs numbers 'a' and 'b'"):
        run("add", payload)


def test_slow_sleeps_for_the_given_seconds():
    started = time.monotonic()
    assert run("slow", {"seconds": 0.05}) == {"slept_seconds": 0.05}
    assert time.monotonic() - started >= 0.05


def test_fail_always_raises_with_its_message():
    with pytest.raises(TaskError, match="always fails"):
        run("fail", {})
    with pytest.raises(TaskError, match="custom boom"):
        run("fail", {"message": "custom boom"})


def test_flaky_fails_its_first_attempts_then_succeeds():
    for attempt in (1, 2):
        with pytest.raises(TaskError, match=f"attempt {attempt} fails"):
            run("flaky", {"fail_times": 2}, attempt=attempt)
    assert run("flaky", {"fail_times": 2}, attempt=3) == {"attempt": 3}


# --- user tasks and the registry -------------------------------------------------


def test_sync_task_runs_in_a_thread_with_its_context():
    @task("test_sync_with_ctx")
    def sync_with_ctx(payload, ctx):
        return {"doubled": payload["n"] * 2, "attempt": ctx.attempt, "in_thread": threading.current_thread().name}

    result = run("test_sync_with_ctx", {"n": 21}, attempt=4)
    assert result["doubled"] == 42 and result["attempt"] == 4
    assert result["in_thread"] != threading.main_thread().name


def test_async_task_with_payload_only_is_awaited():
    @task("test_async_payload_only")
    async def async_payload_only(payload):
        await asyncio.sleep(0)
        return {"got": payload}

    assert get_task("test_async_payload_only").is_async
    assert run("test_async_payload_only", {"k": "v"}) == {"got": {"k": "v"}}


def test_sync_task_thread_is_abandoned_not_awaited_on_timeout():
    release, finished = threading.Event(), threading.Event()

    @task("test_blocking_sync")
    def blocking_sync(payload):
        release.wait(5)
        finished.set()

    pool = ThreadPoolExecutor(max_workers=1)
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            asyncio.run(asyncio.wait_for(execute("test_blocking_sync", {}, make_ctx(), thread_pool=pool), 0.1))
        assert time.monotonic() - started < 2 and not finished.is_set()
    finally:
        release.set()
        pool.shutdown(wait=True)
    assert finished.is_set()


def test_function_with_a_wrong_signature_is_not_registered():
    with pytest.raises(TypeError, match=r"\(payload\) or \(payload, ctx\)"):
        task("test_no_args")(lambda: None)
    with pytest.raises(TypeError, match=r"\(payload\) or \(payload, ctx\)"):
        task("test_three_args")(lambda payload, ctx, extra: None)


def test_reserved_and_taken_names_are_not_registered():
    with pytest.raises(ValueError, match="reserved"):
        task("shell")(lambda payload: None)
    @task("test_taken")
    def first(payload):
        return 1

    with pytest.raises(ValueError, match="already registered by .*first"):
        @task("test_taken")
        def second(payload):
            return 2


def test_unknown_task_is_a_task_error():
    with pytest.raises(TaskError, match="unknown task 'no_such_task'"):
        run("no_such_task", {})


def test_non_json_serialisable_result_is_rejected():
    @task("test_returns_a_set")
    async def returns_a_set(payload):
        return {"ids": {1, 2}}

    @task("test_returns_nan")
    async def returns_nan(payload):
        return float("nan")

    for name in ("test_returns_a_set", "test_returns_nan"):
        with pytest.raises(TaskError, match="not JSON-serialisable"):
            run(name, {})


def test_load_task_modules_registers_the_module_tasks(tmp_path, monkeypatch):
    module_name = f"qforge_user_tasks_{uuid.uuid4().hex}"
    (tmp_path / f"{module_name}.py").write_text(textwrap.dedent(f"""
        from qforge.workers.tasks import task

        @task("{module_name}.greet")
        def greet(payload, ctx):
            return {{"hello": payload["name"], "attempt": ctx.attempt}}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        load_task_modules([module_name])
        assert run(f"{module_name}.greet", {"name": "ada"}, attempt=2) == {"hello": "ada", "attempt": 2}
    finally:
        sys.modules.pop(module_name, None)


def test_load_task_modules_names_a_missing_or_broken_module(tmp_path, monkeypatch):
    with pytest.raises(ImportError, match="qforge_no_such_module"):
        load_task_modules(["qforge_no_such_module"])
    broken = f"qforge_broken_{uuid.uuid4().hex}"
    (tmp_path / f"{broken}.py").write_text("raise RuntimeError('bad config')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match=f"{broken}.*RuntimeError: bad config"):
        load_task_modules([broken])


# --- shell ---------------------------------------------------------------------


def test_shell_returns_exit_code_and_output():
    assert shell("echo out; echo err >&2") == {"exit_code": 0, "stdout": "out\n", "stderr": "err\n"}


def test_shell_non_zero_exit_fails_with_code_and_stderr():
    with pytest.raises(TaskError, match="exited with code 3; stderr: oops") as failure:
        shell("echo partial; echo oops >&2; exit 3")
    assert failure.value.result == {"exit_code": 3, "stdout": "partial\n", "stderr": "oops\n"}


def test_shell_keeps_only_bounded_tails():
    result = shell("head -c 200000 /dev/zero | tr '\\0' a; echo END; head -c 100000 /dev/zero | tr '\\0' b >&2")
    assert result["stdout"] == "a" * (OUTPUT_TAIL_BYTES - 4) + "END\n"
    assert result["stderr"] == "b" * OUTPUT_TAIL_BYTES


def test_shell_env_extends_the_allowed_worker_environment(monkeypatch):
    monkeypatch.setenv("QF_INHERITED", "from-worker")
    monkeypatch.setenv("QF_HIDDEN", "secret")
    command = 'printf "%s|%s|%s" "$QF_INHERITED" "$QF_GREETING" "$QF_HIDDEN"'
    result = run("shell", {"command": command, "env": {"QF_GREETING": "hi there"}}, allow_shell=True,
                 policy=TaskPolicy(shell_env_allow=("QF_INHERITED",)))
    assert result["stdout"] == "from-worker|hi there|"


def test_shell_env_values_must_be_strings():
    with pytest.raises(TaskError, match="'env.PORT' must be a string"):
        shell("true", env={"PORT": 8080})


def test_shell_is_refused_without_allow_shell():
    with pytest.raises(TaskError, match="--allow-shell"):
        run("shell", {"command": "touch /tmp/should-not-exist"}, allow_shell=False)


def test_shell_payload_timeout_fails_with_reason_timeout():
    started = time.monotonic()
    with pytest.raises(TaskError, match="timed out after 0.2s") as failure:
        shell("echo started; sleep 5", timeout_seconds=0.2)
    assert failure.value.reason == "timeout"
    assert failure.value.result["stdout"] == "started\n"
    assert time.monotonic() - started < 2


def test_shell_cancellation_kills_the_whole_process_group(tmp_path):
    pid_file = tmp_path / "pids"
    command = f"echo $$ > {pid_file}; sleep 30 & echo $! >> {pid_file}; sleep 30"
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(execute("shell", {"command": command}, make_ctx(allow_shell=True)), 0.5))
    assert time.monotonic() - started < 3
    shell_pid, background_pid = (int(line) for line in pid_file.read_text().split())
    assert not running(shell_pid) and not running(background_pid)
    assert live_group_members(shell_pid) == []  # the shell led its own group


def test_shell_background_processes_end_with_the_job():
    started = time.monotonic()
    result = shell("sleep 30 & echo $!")
    assert time.monotonic() - started < 3
    assert not running(int(result["stdout"]))


def running(pid: int) -> bool:
    """Alive and not a zombie (orphans may never be reaped inside a container)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(b")") + 2 :][:1] not in (b"Z", b"X")


def live_group_members(group: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rindex(b")") + 2 :].split()
            if int(fields[2]) == group and fields[0] not in (b"Z", b"X"):
                members.append(int(entry.name))
    return members


# --- http ----------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/json":
            self._send(200, b'{"ok": true, "n": 1}', "application/json")
        elif self.path == "/text":
            self._send(200, b"plain hello", "text/plain; charset=utf-8")
        elif self.path == "/fail":
            self._send(500, b"database exploded", "text/plain")
        elif self.path == "/slow":
            self.server.release.wait(5)  # the client gives up first
            try:
                self._send(200, b"too late", "text/plain")
            except OSError:
                pass  # the client hung up, as intended
        else:
            self._send(404, b"no such path", "text/plain")

    def do_POST(self):
        received = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = {"method": self.command, "received": received, "x_test": self.headers.get("X-Test")}
        self._send(201, json.dumps(body).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass  # keep test output quiet


@pytest.fixture
def http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.release = threading.Event()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join()


def test_http_returns_json_body(http_server):
    assert run("http", {"url": f"{http_server}/json"}) == {"ok": True, "n": 1}


def test_http_returns_text_body(http_server):
    assert run("http", {"url": f"{http_server}/text"}) == "plain hello"


def test_http_with_json_posts_it_with_headers(http_server):
    result = run("http", {"url": f"{http_server}/echo", "json": {"a": 1}, "headers": {"X-Test": "yes"}})
    assert result == {"method": "POST", "received": {"a": 1}, "x_test": "yes"}


def test_http_error_status_fails_with_status_and_body(http_server):
    with pytest.raises(TaskError, match="returned HTTP 500: database exploded") as failure:
        run("http", {"url": f"{http_server}/fail"})
    assert failure.value.result == {"status_code": 500, "body": "database exploded"}


def test_http_timeout_fails_with_reason_timeout(http_server):
    started = time.monotonic()
    with pytest.raises(TaskError, match="timed out after 0.2s") as failure:
        run("http", {"url": f"{http_server}/slow", "timeout_seconds": 0.2})
    assert failure.value.reason == "timeout"
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/x", "/relative", 42])
def test_http_refuses_non_http_urls(url):
    with pytest.raises(TaskError, match="url"):
        run("http", {"url": url})
