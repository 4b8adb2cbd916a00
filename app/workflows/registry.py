"""@qforge.workflow: the registry of code workflow functions, filled by the task modules a worker loads."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable

NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")


@dataclass(frozen=True)
class RegisteredWorkflow:
    name: str
    function: Callable[..., Any]
    is_async: bool


_registry: dict[str, RegisteredWorkflow] = {}


def workflow(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `function(ctx, input) -> result` (sync or async) as code workflow `name`."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"workflow name {name!r}: 1-200 of letters, digits and _ . : -")

    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        positional = [p for p in inspect.signature(function).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) != 2:
            raise TypeError(f"workflow {name!r}: the function must take (ctx, input)")
        existing = _registry.get(name)
        if existing is not None and _origin(existing.function) != _origin(function):
            raise ValueError(f"workflow {name!r} is already registered by {_origin(existing.function)}")
        _registry[name] = RegisteredWorkflow(name, function, inspect.iscoroutinefunction(function))
        return function

    return register


def get_workflow(name: str) -> RegisteredWorkflow | None:
    return _registry.get(name)


def registered_workflow_names() -> list[str]:
    return sorted(_registry)


def _origin(function: Callable[..., Any]) -> str:
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"
