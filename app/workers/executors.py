"""Executors: run one job's task, be it a registered Python function, a shell command or an HTTP call.

The shell task is `qforge.workers.shell`, the http task `qforge.workers.http_call`.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import Executor
from typing import Any, Awaitable

from qforge.commands.specs import MAX_DEPTH
from qforge.workers.http_call import run_http
from qforge.workers.secrets import Masker
from qforge.workers.shell import run_shell
from qforge.workers.tasks import RESULT_CHECK, TaskContext, TaskError, get_task

__all__ = ["TaskError", "execute"]


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
    if task == "shell" or task == "http":
        result = await _run_with_secrets(task, payload, ctx)
    else:  # a Python task: it references no secrets, so there is nothing to mask
        result = await run_python(task, payload, ctx, thread_pool)
    if result is None:
        return None
    try:
        RESULT_CHECK.encode(result)
    except (TypeError, ValueError) as exc:
        raise TaskError(f"task {task!r} returned a result that is not JSON-serialisable: {exc}") from exc
    if nested_deeper(result, MAX_DEPTH):
        # The API could not send it back (nor a later step's payload that carries it as input):
        # e.g. echo in a long chain, whose each output holds the one before.
        raise TaskError(f"task {task!r} returned a result nested more than {MAX_DEPTH} levels deep")
    return result


async def _run_with_secrets(task: str, payload: dict, ctx: TaskContext) -> Any:
    """The shell or http task, with the values of the secrets it references masked in what it
    returns or raises."""
    masker = Masker()
    try:
        if task == "shell":
            result = await run_shell(payload, ctx, masker)
        else:
            result = await run_http(payload, ctx.policy, masker)
    except TaskError as exc:
        if masker:
            raise masker.error(exc) from None
        raise
    except Exception as exc:
        if masker:
            raise TaskError(masker.text(f"{type(exc).__name__}: {exc}")) from None
        raise
    return masker.json(result) if masker else result


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


def run_python(task: str, payload: dict, ctx: TaskContext, thread_pool: Executor | None) -> Awaitable[Any]:
    """What to await for the Python task `task`: its coroutine, or its call in `thread_pool` (a plain
    function, not a coroutine around them: one frame less per job). Raises TaskError at once for an
    unknown task."""
    registered = get_task(task)
    if registered.is_async:
        return registered.invoke(payload, ctx)
    loop = asyncio.get_running_loop()
    return loop.run_in_executor(thread_pool, functools.partial(registered.invoke, payload, ctx))

