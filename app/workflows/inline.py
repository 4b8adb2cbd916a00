"""Inline runs of code workflows' functions: in the transaction of the report that wakes them.

Set by a worker around its reports (inline_activations): the next run of a code workflow
whose function this process has registered runs at once (qforge.workflows.durable), against
the rows the advance has just read, and what it decides is written in the transaction of the
report that woke it: one transaction per step instead of two, no claim of the run and no read
of its history. Its log is a run's as a job leaves it (an activation row with its decisions),
less the claim; it has its qforge.run span, as a job's.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from qforge import tracing
from qforge.workflows import journal

# The function gets INLINE_SECONDS: one that takes longer (it is waiting on something, or the
# host is busy) is not waited for in the transaction. The report commits with the run as a job, as
# before, and the worker that claims that job adopts the run still going (adopt), so the
# function runs once, and a crash from then on is a crash of that job.
INLINE_SECONDS = 0.2
# The runner a worker gives (qforge.workflows.activation.activate_inline): passed in, not imported,
# since activation sits above the workers' task registry, which sits above this module.
InlineRunner = Callable[[dict[str, Any], list[dict[str, Any]]], dict[str, Any] | None]
_INLINE: contextvars.ContextVar[InlineRunner | None] = contextvars.ContextVar("qforge_inline_activations",
                                                                             default=None)
_threads = ThreadPoolExecutor(32, thread_name_prefix="qforge-inline")
_pending: dict[str, Future] = {}  # activation job id -> its inline run, still going when it was enqueued
_pending_lock = threading.Lock()
PENDING_KEPT = 256  # runs whose job another worker claimed (or whose report rolled back) are forgotten


@contextlib.contextmanager
def inline_activations(runner: InlineRunner) -> Iterator[None]:
    token = _INLINE.set(runner)
    try:
        yield
    finally:
        _INLINE.reset(token)


def run(runner: InlineRunner, workflow: dict[str, Any], rows: list[dict[str, Any]],
        run_job: InlineRun) -> dict[str, Any] | Future | None:
    """The run's decisions; the Future of a run still going after INLINE_SECONDS; None when it must
    run as a job (qforge.workflows.activation.activate_inline)."""
    return wait(submit(runner, workflow, rows, run_job))


def submit(runner: InlineRunner, workflow: dict[str, Any], rows: list[dict[str, Any]],
           run_job: InlineRun) -> Future:
    """The run started (run waits for it at once; an advance of several workflows starts theirs
    together, qforge.workflows.batch.early_runs)."""
    return _threads.submit(_traced, runner, workflow, rows, run_job)


def wait(future: Future) -> dict[str, Any] | Future | None:
    """What run returns, for a run that submit started."""
    try:
        return future.result(timeout=INLINE_SECONDS)
    except TimeoutError:
        return future
    except BaseException:  # noqa: BLE001  (SystemExit from the function: the job's run reports it)
        return None


def _traced(runner: InlineRunner, workflow: dict[str, Any], rows: list[dict[str, Any]],
            run_job: InlineRun) -> dict[str, Any] | None:
    with tracing.run_span(run_job):
        return runner(workflow, rows)


def pending_put(job_id: str, future: Future) -> None:
    with _pending_lock:
        _pending[job_id] = future
        while len(_pending) > PENDING_KEPT:
            del _pending[next(iter(_pending))]


def adopt(job_id: uuid.UUID) -> Future | None:
    """The inline run an activation job takes over (its result is the job's; None: the function
    must run as a job after all), or None when there is none."""
    with _pending_lock:
        return _pending.pop(str(job_id), None)


def current() -> InlineRunner | None:
    """The runner a worker set around its reports (None: none here)."""
    return _INLINE.get()


@dataclass(frozen=True)
class InlineRun:
    """An inline run's job as tracing.run_span reads it: the run has its qforge.run span, as a job's."""

    id: uuid.UUID
    step: str
    queue: str
    workflow_id: uuid.UUID
    trace: dict[str, str] | None
    task: str = journal.TASK
    attempt: int = 0
