"""Executors: run one job's task, be it a registered Python function, a shell command or an HTTP call."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import signal
from concurrent.futures import Executor
from typing import Any

import httpx

from qforge.workers.isolation import Step
from qforge.commands.specs import MAX_DEPTH
from qforge.workers.sandbox import TaskPolicy, resolve
from qforge.workers.secrets import Masker, resolve_references
from qforge.workers.tasks import RESULT_CHECK, TaskContext, TaskError, get_task

__all__ = ["TaskError", "execute"]

OUTPUT_TAIL_BYTES = 64 * 1024  # per stream: enough to debug, bounded whatever a command prints
MESSAGE_TAIL_CHARS = 2000  # of stderr / an error body, quoted in the failure message
KILL_GRACE_SECONDS = 2.0  # between SIGTERM and SIGKILL of a shell command's process group
PIPE_DRAIN_SECONDS = 1.0  # to read what is left in the pipes once the group is gone
HTTP_DEFAULT_TIMEOUT_SECONDS = 300.0  # a Lambda-style call may be slow; the job timeout still applies
HTTP_MAX_RESPONSE_BYTES = 1024 * 1024  # a result lands in the event log; keep it like the API's body limit
HTTP_MAX_REDIRECTS = 10  # each hop's address is checked like the first


async def execute(
    task: str, payload: dict, ctx: TaskContext, *, thread_pool: Executor | None = None
) -> Any:
    """Run `task` and return its JSON-serialisable result, or raise (TaskError or the task's own error).

    The caller applies the job timeout by cancelling this coroutine (asyncio.timeout /
    wait_for). Cancellation is clean for async tasks, shell (its whole process group is
    killed before the CancelledError propagates) and http. A sync Python task runs in a
    thread that cannot be interrupted: the await ends at once but the thread is abandoned
    and runs on to completion, its result discarded. Give such workers their own
    `thread_pool` and shut it down with wait=False so a stuck thread cannot block exit.
    """
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise TaskError(f"the payload must be a JSON object, got {type(payload).__name__}")
    masker = Masker()  # the values of the secrets a shell or http step references
    try:
        if task == "shell":
            result = await run_shell(payload, ctx, masker)
        elif task == "http":
            result = await run_http(payload, ctx.policy, masker)
        else:
            result = await run_python(task, payload, ctx, thread_pool)
    except TaskError as exc:
        if masker:
            raise masker.error(exc) from None
        raise
    except Exception as exc:
        if masker:
            raise TaskError(masker.text(f"{type(exc).__name__}: {exc}")) from None
        raise
    if masker:
        result = masker.json(result)
    try:
        if result is not None:
            RESULT_CHECK.encode(result)
    except (TypeError, ValueError) as exc:
        raise TaskError(f"task {task!r} returned a result that is not JSON-serialisable: {exc}") from exc
    if nested_deeper(result, MAX_DEPTH):
        # The API could not send it back (nor a later step's payload that carries it as input):
        # e.g. echo in a long chain, whose each output holds the one before.
        raise TaskError(f"task {task!r} returned a result nested more than {MAX_DEPTH} levels deep")
    return result


def nested_deeper(value: Any, limit: int) -> bool:
    """Do objects and lists nest more than `limit` deep in `value`? (No recursion: any depth.)"""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth >= limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


async def run_python(task: str, payload: dict, ctx: TaskContext, thread_pool: Executor | None) -> Any:
    registered = get_task(task)
    if registered.is_async:
        return await registered.invoke(payload, ctx)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(thread_pool, functools.partial(registered.invoke, payload, ctx))


# --- shell ----------------------------------------------------------------------


async def run_shell(payload: dict, ctx: TaskContext, masker: Masker | None = None) -> dict:
    if not ctx.allow_shell:
        raise TaskError("shell tasks are not allowed on this worker (start it with --allow-shell)")
    command = payload.get("command")
    if not isinstance(command, str) or not command.strip():
        raise TaskError("a shell payload needs a non-empty string 'command'")
    masker = masker if masker is not None else Masker()
    payload = resolve_references(payload, "env", ctx.policy.secrets_dir, masker)
    # Never the worker's whole environment: its database URL and tokens would
    # land in the step's stored output (qforge.workers.sandbox).
    env = ctx.policy.shell_environment(_environment(payload.get("env")))
    timeout_seconds = _seconds(payload, "timeout_seconds")
    isolation = ctx.policy.isolation
    step = isolation.prepare() if isolation is not None else None
    try:
        return await _run_command(command, env, timeout_seconds, ctx.policy, step, masker)
    finally:
        if step is not None:
            step.finish()  # also on cancel: whatever the step left in its cgroup dies, its HOME goes


async def _run_command(command: str, env: dict[str, str], timeout_seconds: float | None, policy: TaskPolicy,
                       step: Step | None, masker: Masker) -> dict:
    argv = policy.shell_argv(command)
    if step is not None:
        argv = step.argv(argv)
        env = {**env, **step.environment()}
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=step.directory if step is not None else None,
        # Its own session, hence its own process group: one killpg reaches every descendant
        # (and, isolated, PID 1 of the step's namespace, whose end ends the rest).
        start_new_session=True,
    )
    stdout, stderr = _Tail(masker), _Tail(masker)
    readers = [
        asyncio.create_task(stdout.read_from(process.stdout)),
        asyncio.create_task(stderr.read_from(process.stderr)),
    ]
    timed_out = False
    try:
        async with asyncio.timeout(timeout_seconds):
            await _wait_for_exit(process)
    except TimeoutError:
        timed_out = True
    finally:
        # On success, timeout and cancellation alike: whatever the command left running
        # (background jobs) ends with the job, so no step leaks processes.
        try:
            await _stop_process_group(process)
            if step is not None:
                step.kill_all()  # setsid escapees in its cgroup: before draining the pipes they hold
        finally:
            await _drain(process, readers)

    result = {"exit_code": process.returncode, "stdout": stdout.text(), "stderr": stderr.text()}
    if timed_out:
        raise TaskError(
            f"shell command timed out after {timeout_seconds:g}s and was killed", reason="timeout", result=result
        )
    if process.returncode != 0:
        raise TaskError(
            f"shell command {_describe_exit(process.returncode)}; stderr: {_tail(result['stderr'])}", result=result
        )
    return result


class _Tail:
    """The last OUTPUT_TAIL_BYTES of a stream, secrets masked."""

    def __init__(self, masker: Masker) -> None:
        self.buffer = bytearray()
        self.masker = masker
        self.cut = False

    async def read_from(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(OUTPUT_TAIL_BYTES):
            self.buffer += chunk
            if len(self.buffer) > OUTPUT_TAIL_BYTES:
                self.cut = True
                del self.buffer[:-OUTPUT_TAIL_BYTES]

    def text(self) -> str:
        # The cut may split a UTF-8 sequence; replacement beats failing the job.
        text = self.buffer.decode("utf-8", errors="replace")
        return self.masker.text(text, cut_head=self.cut) if self.masker else text


async def _stop_process_group(process: asyncio.subprocess.Process) -> None:
    group = process.pid  # start_new_session made the shell its group leader
    if _group_alive(group):
        _signal_group(group, signal.SIGTERM)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + KILL_GRACE_SECONDS
            while loop.time() < deadline and _group_alive(group):
                await asyncio.sleep(0.05)
        finally:
            # Also reached if this cleanup is itself cancelled: nothing may outlive its job.
            if _group_alive(group):
                _signal_group(group, signal.SIGKILL)
    await _wait_for_exit(process)


async def _wait_for_exit(process: asyncio.subprocess.Process) -> None:
    """Until the shell itself has exited. Process.wait() also waits for the pipes to
    close, which a background child holding stdout would delay for as long as it runs."""
    pipes_closed = asyncio.ensure_future(process.wait())
    try:
        while process.returncode is None:
            await asyncio.wait({pipes_closed}, timeout=0.05)
    finally:
        pipes_closed.cancel()


async def _drain(process: asyncio.subprocess.Process, readers: list[asyncio.Task]) -> None:
    try:
        _, pending = await asyncio.wait(readers, timeout=PIPE_DRAIN_SECONDS)
    finally:
        for reader in readers:
            reader.cancel()  # no-op for finished readers
    if pending:
        # A process that left the group (setsid, a daemon) still holds a pipe open: stop
        # reading rather than hang the job, and close our ends (no public API for that).
        process._transport.close()  # type: ignore[attr-defined]
    await asyncio.gather(*readers, return_exceptions=True)


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _group_alive(group: int) -> bool:
    """Whether a process of the group still runs. Zombies do not count: in a container
    PID 1 may never reap orphans, and waiting for them would always cost the full grace."""
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    if not os.path.isdir("/proc"):
        return True  # no cheap way to tell zombies apart; the grace period bounds the wait
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat_file:
                    stat = stat_file.read()
            except OSError:
                continue  # exited meanwhile
            # After the ")" closing the command name: state, ppid, pgrp, ...
            state, _ppid, pgrp = stat[stat.rindex(b")") + 2 :].split(b" ", 3)[:3]
            if int(pgrp) == group and state != b"Z":
                return True
    return False


def _describe_exit(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        return f"was killed by signal {signal.Signals(-returncode).name} (exit code {returncode})"
    return f"exited with code {returncode}"


def _environment(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise TaskError("shell 'env' must be an object of string values (or {\"secret\": NAME})")
    for name, value in env.items():
        if not name or "=" in name or "\0" in name:
            raise TaskError(f"shell 'env' has an invalid variable name {name!r}")
        if not isinstance(value, str) or "\0" in value:
            raise TaskError(f"shell 'env.{name}' must be a string or {{\"secret\": NAME}},"
                            f" got {type(value).__name__}")
    return env


# --- http -----------------------------------------------------------------------


async def run_http(payload: dict, policy: TaskPolicy | None = None, masker: Masker | None = None) -> Any:
    """Call the URL; every address it (and each redirect) resolves to is checked against
    `policy` (no loopback, private, link-local... unless QFORGE_HTTP_ALLOW allows it), and
    the connection goes to the address that was checked, so a second DNS answer cannot
    swap it (TLS still verifies the host name, sent as SNI)."""
    policy = policy or TaskPolicy()
    url = payload.get("url")
    if not isinstance(url, str):
        raise TaskError("an http payload needs a string 'url'")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise TaskError(f"http 'url' is not a valid URL: {exc}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise TaskError(f"http 'url' must be an absolute http:// or https:// URL, got {url!r}")
    method = payload.get("method") or ("POST" if "json" in payload else "GET")
    if not isinstance(method, str) or not method.isalpha():
        raise TaskError(f"http 'method' must be a method name such as GET or POST, got {method!r}")
    method = method.upper()
    payload = resolve_references(payload, "headers", policy.secrets_dir, masker if masker is not None else Masker())
    headers = payload.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise TaskError("http 'headers' must be an object of string values (or {\"secret\": NAME})")
    timeout_seconds = _seconds(payload, "timeout_seconds") or HTTP_DEFAULT_TIMEOUT_SECONDS
    body_argument = {"json": payload["json"]} if "json" in payload else {}

    try:
        # httpx's timeout is per read or write; asyncio.timeout bounds the whole exchange.
        async with asyncio.timeout(timeout_seconds):
            async with httpx.AsyncClient(timeout=timeout_seconds, follow_redirects=False) as client:
                response, body, complete = await _exchange(client, policy, method, parsed, headers,
                                                           body_argument)
    except (TimeoutError, httpx.TimeoutException) as exc:
        raise TaskError(f"{method} {url} timed out after {timeout_seconds:g}s", reason="timeout") from exc
    except httpx.HTTPError as exc:
        raise TaskError(f"{method} {url} failed: {type(exc).__name__}: {exc}") from exc

    text = _decode(body, response)
    if not response.is_success:
        raise TaskError(
            f"{method} {url} returned HTTP {response.status_code}: {_tail(text)}",
            result={"status_code": response.status_code, "body": text[-OUTPUT_TAIL_BYTES:]},
        )
    if not complete:
        raise TaskError(f"{method} {url} returned more than {HTTP_MAX_RESPONSE_BYTES} bytes")
    content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json" or content_type.endswith("+json"):
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:
            pass  # a service that mislabels its text still succeeded; keep the text
    return text


async def _exchange(client: httpx.AsyncClient, policy: TaskPolicy, method: str, url: httpx.URL,
                    headers: dict[str, str], body_argument: dict) -> tuple[httpx.Response, bytes, bool]:
    """Send, following up to HTTP_MAX_REDIRECTS redirects ourselves, each hop checked."""
    for _ in range(HTTP_MAX_REDIRECTS + 1):
        request = await _checked_request(client, policy, method, url, headers, body_argument)
        response = await client.send(request, stream=True)
        if not response.is_redirect:
            try:
                body, complete = await _read_bounded(response)
            finally:
                await response.aclose()
            return response, body, complete
        await response.aclose()
        try:
            next_url = url.join(response.headers["location"])
        except httpx.InvalidURL as exc:
            raise TaskError(f"{method} {url} redirected to an invalid URL: {exc}") from exc
        if next_url.scheme not in ("http", "https") or not next_url.host:
            raise TaskError(f"{method} {url} redirected to {next_url}, which is not an http(s) URL")
        # As browsers and httpx do: 303 (and 301/302 after a POST) go on with a GET
        # and no body; 307 and 308 repeat the request as it was.
        if (response.status_code == 303 and method != "HEAD") or (
                response.status_code in (301, 302) and method == "POST"):
            method, body_argument = "GET", {}
        if next_url.host != url.host:  # credentials meant for one host never go to another
            headers = {k: v for k, v in headers.items() if k.lower() not in ("authorization", "cookie")}
        url = next_url
    raise TaskError(f"{method} {url}: more than {HTTP_MAX_REDIRECTS} redirects")


async def _checked_request(client: httpx.AsyncClient, policy: TaskPolicy, method: str, url: httpx.URL,
                           headers: dict[str, str], body_argument: dict) -> httpx.Request:
    """A request to an address of url's host that the policy allows, every address checked."""
    host = url.host
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        addresses = await resolve(host, port)
    except OSError as exc:
        raise TaskError(f"{method} {url} failed: cannot resolve {host}: {exc}") from exc
    for address in addresses:
        refusal = policy.refusal(host, address)
        if refusal is not None:
            raise TaskError(f"{method} {url} refused: {refusal}", reason="refused")
    pinned = url.copy_with(host=str(addresses[0]))
    sent = {k: v for k, v in headers.items() if k.lower() != "host"}
    sent["Host"] = url.netloc.decode("ascii")
    extensions = {}
    if url.scheme == "https" and str(addresses[0]) != host.strip("[]"):
        extensions["sni_hostname"] = host  # certificate checked against the name, not the address
    return client.build_request(method, pinned, headers=sent, extensions=extensions, **body_argument)


async def _read_bounded(response: httpx.Response) -> tuple[bytes, bool]:
    """At most HTTP_MAX_RESPONSE_BYTES of the body, and whether that was all of it."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > HTTP_MAX_RESPONSE_BYTES:
            return bytes(body[:HTTP_MAX_RESPONSE_BYTES]), False
    return bytes(body), True


def _decode(body: bytes, response: httpx.Response) -> str:
    try:
        return body.decode(response.charset_encoding or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return body.decode("utf-8", errors="replace")


# --- shared ---------------------------------------------------------------------


def _seconds(payload: dict, field: str) -> float | None:
    value = payload.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise TaskError(f"'{field}' must be a positive number of seconds, got {value!r}")
    return float(value)


def _tail(text: str) -> str:
    text = text.strip()
    if not text:
        return "(empty)"
    return text if len(text) <= MESSAGE_TAIL_CHARS else "..." + text[-MESSAGE_TAIL_CHARS:]
