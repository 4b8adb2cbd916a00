"""Task registry: named Python tasks, the built-in tasks, and loading of user task modules."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable
from uuid import UUID

from qforge.workers.sandbox import TaskPolicy

# Whether a task's result can be stored: allow_nan=False, as PostgreSQL's jsonb rejects NaN and
# Infinity. One encoder for every job (json.dumps with an argument builds a new one per call).
RESULT_CHECK = json.JSONEncoder(allow_nan=False)

# Handled by executors.py (shell.py, http_call.py) before the registry is consulted, so a Python task of
# the same name could never run.
RESERVED_TASK_NAMES = frozenset({"shell", "http", "qforge.workflow"})  # the last: code workflows' runs


@dataclass(frozen=True)
class TaskContext:
    """What a running task may know about its job (passed when it takes a second argument)."""

    job_id: UUID | str
    attempt: int  # 1 on the first run; counts every claim, including failed ones
    task: str
    queue: str = "default"
    workflow_id: UUID | str | None = None
    step: str | None = None
    timeout_seconds: float | None = None
    allow_shell: bool = False
    # What shell and http steps may see and reach (QFORGE_SHELL_*, QFORGE_HTTP_ALLOW).
    policy: TaskPolicy = field(default_factory=TaskPolicy)


class TaskError(Exception):
    """A task failed in a way it could describe: `reason` goes into the Failed event
    (e.g. "error", "timeout"), `result` keeps whatever partial output there was."""

    def __init__(self, message: str, *, reason: str = "error", result: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.result = result


@dataclass(frozen=True)
class RegisteredTask:
    name: str
    function: Callable[..., Any]
    is_async: bool
    takes_context: bool

    def invoke(self, payload: dict, ctx: TaskContext) -> Any:
        """Call the function (for async tasks this returns the coroutine to await)."""
        if self.takes_context:
            return self.function(payload, ctx)
        return self.function(payload)


_registry: dict[str, RegisteredTask] = {}


def task(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function `(payload)` or `(payload, ctx)`, sync or async, as task `name`."""

    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        if not isinstance(name, str) or not name:
            raise ValueError("a task name must be a non-empty string")
        if name in RESERVED_TASK_NAMES:
            raise ValueError(f"task name {name!r} is reserved for the built-in {name} executor")
        existing = _registry.get(name)
        # Importing the same module twice (reload, `python -m` plus import) re-registers
        # the same function; only a different function under a taken name is a mistake.
        if existing is not None and _origin(existing.function) != _origin(function):
            raise ValueError(f"task {name!r} is already registered by {_origin(existing.function)}")
        _registry[name] = RegisteredTask(
            name=name,
            function=function,
            is_async=_is_async(function),
            takes_context=_takes_context(name, function),
        )
        return function

    return register


def get_task(name: str) -> RegisteredTask:
    """The registered task `name`; TaskError if no loaded module registered it."""
    try:
        return _registry[name]
    except KeyError:
        raise TaskError(f"unknown task {name!r}: this worker knows {', '.join(sorted({*_registry, 'http', 'shell'}))}; "
                        "load the module that registers it with qforge worker --tasks my.module",
                        reason="unknown_task") from None


def registered_task_names() -> list[str]:
    return sorted(_registry)


def load_task_modules(names: list[str]) -> None:
    """Import each module so its @task decorators run (the worker's --tasks)."""
    # A console script's sys.path starts at its own bin directory, not at the
    # project the user runs it from; Celery and RQ add the working directory too.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in (n.strip() for n in names):
        if not name:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:  # a SyntaxError or a failing import inside counts too
            raise ImportError(f"cannot load task module {name!r}: {type(exc).__name__}: {exc}") from exc


def _origin(function: Callable[..., Any]) -> str:
    module = getattr(function, "__module__", "?")
    return f"{module}.{getattr(function, '__qualname__', repr(function))}"


def _is_async(function: Callable[..., Any]) -> bool:
    call = getattr(type(function), "__call__", None)  # callable objects with async __call__
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)


def _takes_context(name: str, function: Callable[..., Any]) -> bool:
    """True for `(payload, ctx)`, False for `(payload)`; anything else is refused at import time."""
    parameters = list(inspect.signature(function).parameters.values())
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    varargs = any(p.kind is p.VAR_POSITIONAL for p in parameters)
    required_keyword_only = [p for p in parameters if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if required_keyword_only or len(required) > 2 or (not positional and not varargs):
        raise TypeError(f"task {name!r}: the function must take (payload) or (payload, ctx)")
    return len(positional) >= 2 or varargs


# --- Built-in tasks -----------------------------------------------------------
# The trivial ones are async so they never take a thread from the pool.


@task("echo")
async def echo(payload: dict) -> dict:
    return payload


@task("add")
async def add(payload: dict) -> int | float:
    operands = [payload.get("a"), payload.get("b")]
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in operands):
        raise TaskError(f"add needs numbers 'a' and 'b', got a={operands[0]!r}, b={operands[1]!r}")
    return operands[0] + operands[1]


@task("slow")
async def slow(payload: dict) -> dict:
    # The worker heartbeats on its own schedule, so a long sleep here keeps the job alive.
    seconds = payload.get("seconds", 1)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < float("inf"):
        raise TaskError(f"slow needs a non-negative number 'seconds', got {seconds!r}")
    await asyncio.sleep(seconds)
    return {"slept_seconds": seconds}


@task("fail")
async def fail(payload: dict) -> None:
    raise TaskError(str(payload.get("message") or "task 'fail' always fails"))


@task("flaky")
async def flaky(payload: dict, ctx: TaskContext) -> dict:
    fail_times = payload.get("fail_times", 1)
    if isinstance(fail_times, bool) or not isinstance(fail_times, int) or fail_times < 0:
        raise TaskError(f"flaky needs a non-negative integer 'fail_times', got {fail_times!r}")
    if ctx.attempt <= fail_times:
        raise TaskError(f"flaky: attempt {ctx.attempt} fails (planned to fail {fail_times} time(s))")
    return {"attempt": ctx.attempt}
