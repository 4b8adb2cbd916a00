"""QForge: an event-sourced job queue and DAG workflow orchestrator on PostgreSQL."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("qforge")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
