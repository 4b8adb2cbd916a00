"""Executors: run one job's task, be it a registered Python function, a shell command or an HTTP call.

The shell task is `qforge.workers.shell`, the http task `qforge.workers.http_call`.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import Executor
from typing import Any

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

