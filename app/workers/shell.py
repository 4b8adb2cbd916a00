"""The built-in shell task: a command in a process group of its own (isolated if so set), killed whole at its end."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from qforge.workers.isolation import Step
from qforge.workers.payloads import OUTPUT_TAIL_BYTES, message_tail, payload_seconds
from qforge.workers.sandbox import TaskPolicy
from qforge.workers.secrets import Masker, resolve_references
from qforge.workers.tasks import TaskContext, TaskError

KILL_GRACE_SECONDS = 2.0  # between SIGTERM and SIGKILL of a shell command's process group
PIPE_DRAIN_SECONDS = 1.0  # to read what is left in the pipes once the group is gone


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
    timeout_seconds = payload_seconds(payload, "timeout_seconds")
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
            f"shell command {_describe_exit(process.returncode)}; stderr: {message_tail(result['stderr'])}",
            result=result,
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

