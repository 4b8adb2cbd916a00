"""QForge: an event-sourced job queue and DAG workflow orchestrator on PostgreSQL.

The public names below are loaded on first use, so `import qforge` (which every
worker, CLI command and task module does) costs nothing of httpx, psycopg or the
API's models until a name is asked for.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("qforge")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

# name -> module that defines it
_PUBLIC = {
    "Client": "qforge.client", "AsyncClient": "qforge.client", "ApiError": "qforge.client",
    "BadRequest": "qforge.client", "Unauthorized": "qforge.client", "Forbidden": "qforge.client",
    "NotFound": "qforge.client", "Conflict": "qforge.client", "Invalid": "qforge.client",
    "PayloadTooLarge": "qforge.client", "Unavailable": "qforge.client",
    "JobFailed": "qforge.client", "WaitTimeout": "qforge.client", "Unreachable": "qforge.client",
    "enqueue": "qforge.producer", "submit": "qforge.producer",
    "enqueue_async": "qforge.producer", "submit_async": "qforge.producer",
    "enqueue_many": "qforge.producer", "enqueue_many_async": "qforge.producer",
    "JobSpec": "qforge.commands.specs", "WorkflowSpec": "qforge.commands.specs",
    "workflow": "qforge.workflows.registry", "StepFailed": "qforge.workflows.replay",
    "start": "qforge.producer", "start_async": "qforge.producer",
    "task": "qforge.workers.tasks", "TaskContext": "qforge.workers.tasks", "TaskError": "qforge.workers.tasks",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'qforge' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
