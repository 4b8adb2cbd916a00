"""One activation of a code workflow on a worker: run the function from the top against its journal.

The worker hands this module an activation job (task `qforge.workflow`) and the
workflow's rows; what it returns is the activation's result (see
qforge.workflows.journal), which the activation's Succeeded event records and
qforge.workflows.durable turns into steps in the same transaction. Whatever the
function does wrong (raises, asks for another step than the log holds, is not
registered here) is a result too, with an `outcome` that fails the workflow:
only a crash of the worker makes the activation run again.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from datetime import datetime, timezone
from typing import Any, Callable

from qforge.workers.tasks import RESULT_CHECK
from qforge.workflows import journal
from qforge.workflows.context import AsyncContext, Context
from qforge.workflows.registry import get_workflow
from qforge.workflows.replay import Nondeterministic, Replay, StepFailed, Suspended, describe


def failed(reason: str, error: str) -> dict[str, Any]:
    return {"status": "failed", "reason": reason, "error": f"{reason}: {error}"}


def _settle(replay: Replay, call: Callable[[], Any]) -> tuple[str, Any]:
    """Run the function's body (in a thread for sync functions): ("returned" | "raised", value)."""
    try:
        return "returned", call()
    except BaseException as exc:  # Suspended and Nondeterministic are BaseExceptions by design
        return "raised", exc


async def activate(workflow: dict[str, Any], rows: list[dict[str, Any]], *,
                   thread_pool: Executor | None = None) -> dict[str, Any]:
    """The activation's result: new ops and what it waits on, or its outcome."""
    registered = get_workflow(workflow["code"])
    if registered is None:
        return {"ops": [], "outcome": failed("unknown_workflow", (
            f"no workflow {workflow['code']!r} is registered on this worker (load its module with --tasks)"))}
    replay = Replay(journal.journal(rows), journal.step_records(rows), datetime.now(timezone.utc))
    if registered.is_async:
        ctx: Context = AsyncContext(replay, workflow["id"], workflow.get("input"))
        try:
            how, value = "returned", await registered.function(ctx, workflow.get("input"))
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            how, value = "raised", exc
    else:
        ctx = Context(replay, workflow["id"], workflow.get("input"))
        loop = asyncio.get_running_loop()
        how, value = await loop.run_in_executor(
            thread_pool, _settle, replay, lambda: registered.function(ctx, workflow.get("input")))
    return _result(replay, how, value)


def activate_inline(workflow: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The activation's result computed here and now, in the caller's thread (a worker's report
    transaction: qforge.workflows.durable), or None where it must run as a job instead: the
    function is not registered in this process, is async, or asked for something not storable."""
    registered = get_workflow(workflow["code"])
    if registered is None or registered.is_async:
        return None
    replay = Replay(journal.journal(rows), journal.step_records(rows), datetime.now(timezone.utc))
    ctx = Context(replay, workflow["id"], workflow.get("input"))
    result = _result(replay, *_settle(replay, lambda: registered.function(ctx, workflow.get("input"))))
    try:
        encoded = RESULT_CHECK.encode(result)
    except (TypeError, ValueError):
        return None  # its job reports why (as a failed run)
    return None if "\\u0000" in encoded else result  # jsonb refuses it: the job's report handles that


def _result(replay: Replay, how: str, value: Any) -> dict[str, Any]:
    if how == "raised":
        if isinstance(value, Suspended):
            return {"ops": replay.new_ops, "waiting_on": value.waiting_on}
        if isinstance(value, Nondeterministic):
            return {"ops": [], "outcome": failed("nondeterministic", str(value))}
        if isinstance(value, StepFailed):
            return {"ops": replay.new_ops, "outcome": failed("step_failed", str(value))}
        if isinstance(value, Exception):
            return {"ops": replay.new_ops, "outcome": failed("error", f"{type(value).__name__}: {value}")}
        raise value  # SystemExit, KeyboardInterrupt: not the function's outcome
    if replay.replaying():
        held = replay.journal[replay.cursor]
        return {"ops": [], "outcome": failed("nondeterministic", (
            f"step '{held.get('step') or '-'}': the function returned where the log holds {describe(held)}"
            f" at operation {replay.cursor + 1}"))}
    try:
        RESULT_CHECK.encode(value)
    except (TypeError, ValueError) as exc:
        return {"ops": replay.new_ops, "outcome": failed("error", f"the result is not JSON: {exc}")}
    return {"ops": replay.new_ops, "outcome": {"status": "succeeded", "result": value}}
