"""`ctx`, what a code workflow's function calls: run, start, gather, sleep, wait, child, now, uuid, random, version."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from qforge.commands.specs import JobSpec, parse_spec
from qforge.workflows.replay import Handle, Replay

# ctx.run options, as POST /jobs takes them (tags and idempotency come from the workflow).
STEP_OPTIONS = frozenset({"queue", "priority", "max_retries", "timeout_seconds", "delay_seconds",
                          "concurrency_key", "concurrency_limit", "fairness_key",
                          "backoff_base_seconds", "backoff_cap_seconds"})
MAX_SECONDS = 30 * 86400


def _step_options(options: dict[str, Any]) -> dict[str, Any]:
    if not options:
        return options
    unknown = sorted(set(options) - STEP_OPTIONS)
    if unknown:
        raise TypeError(f"unknown step option(s) {', '.join(unknown)}; allowed: {', '.join(sorted(STEP_OPTIONS))}")
    parse_spec(JobSpec, {"task": "x", **options})  # checks bounds as POST /jobs does
    return options


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_SECONDS:
        raise ValueError(f"{what} must be a number of seconds from 0 to {MAX_SECONDS}, got {value!r}")
    return float(value)


class Context:
    """The sync form: every call returns its value (or unwinds the function while it waits)."""

    def __init__(self, replay: Replay, workflow_id: uuid.UUID | str, input: Any) -> None:
        self._replay = replay
        self.workflow_id = workflow_id
        self.input = input

    def start(self, task: str, payload: dict[str, Any] | None = None, *, step: str | None = None,
              **options: Any) -> Handle:
        """Schedule a step and go on; ctx.gather(handle) gives its result."""
        if not isinstance(task, str) or not task:
            raise ValueError("a step needs a task name")
        if payload is not None and not isinstance(payload, dict):
            raise TypeError(f"a step's payload must be a dict, got {type(payload).__name__}")
        name = self._replay.step_name(task, step)
        self._replay.record({"op": "run", "step": name, "task": task, "payload": payload or {},
                             "options": _step_options(options)})
        return Handle(name)

    def gather(self, *handles: Handle) -> list[Any]:
        """The started steps' results, in order (they run in parallel); StepFailed for the first failed."""
        if not all(isinstance(h, Handle) for h in handles):
            raise TypeError("ctx.gather takes the handles ctx.start returned")
        return self._replay.outcome([h.step for h in handles])

    def run(self, task: str, payload: dict[str, Any] | None = None, *, step: str | None = None,
            **options: Any) -> Any:
        """Run one step (a job of this workflow) and return its result; StepFailed when it dies."""
        return self.gather(self.start(task, payload, step=step, **options))[0]

    def sleep(self, seconds: float) -> None:
        """Wait `seconds` (a timer step: no worker slot is held)."""
        seconds = _seconds(seconds, "ctx.sleep")
        name = self._replay.step_name("sleep", None)
        self._replay.record({"op": "sleep", "step": name, "seconds": seconds})
        self._replay.outcome([name])

    def wait(self, step: str, timeout: float | None = None) -> Any:
        """Wait for POST /workflows/{id}/steps/{step}/trigger; its payload. StepFailed on timeout."""
        if not isinstance(step, str) or not step:
            raise ValueError("ctx.wait needs the step's name")
        timeout = None if timeout is None else _seconds(timeout, "ctx.wait's timeout")
        name = self._replay.step_name(step, step)
        self._replay.record({"op": "wait", "step": name, "timeout": timeout})
        return self._replay.outcome([name])[0]

    def child(self, name: str, input: Any = None, *, step: str | None = None) -> Any:
        """Run a sub-workflow (a code workflow, else the stored definition `name`); its result."""
        if not isinstance(name, str) or not name:
            raise ValueError("ctx.child needs a workflow name")
        step_name = self._replay.step_name(name, step)
        self._replay.record({"op": "child", "step": step_name, "workflow": name, "input": input})
        return self._replay.outcome([step_name])[0]

    def now(self) -> datetime:
        """The time, as first recorded."""
        return datetime.fromisoformat(self._replay.value("now"))

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(self._replay.value("uuid"))

    def random(self) -> float:
        """A float in [0, 1), as first recorded."""
        return self._replay.value("random")

    def version(self, change: str) -> bool:
        """True when this run meets `change` new, False when its log was written before it."""
        if not isinstance(change, str) or not change:
            raise ValueError("ctx.version needs a change id")
        return self._replay.version(change)

    def is_replaying(self) -> bool:
        """True while the function re-runs operations the log holds (e.g. to skip logging)."""
        return self._replay.replaying()


class AsyncContext(Context):
    """The async form: the calls that may wait are awaited (`await ctx.run(...)`)."""

    async def gather(self, *handles: Handle) -> list[Any]:  # type: ignore[override]
        return Context.gather(self, *handles)

    async def run(self, task: str, payload: dict[str, Any] | None = None, *,  # type: ignore[override]
                  step: str | None = None, **options: Any) -> Any:
        return Context.gather(self, self.start(task, payload, step=step, **options))[0]

    async def sleep(self, seconds: float) -> None:  # type: ignore[override]
        Context.sleep(self, seconds)

    async def wait(self, step: str, timeout: float | None = None) -> Any:  # type: ignore[override]
        return Context.wait(self, step, timeout)

    async def child(self, name: str, input: Any = None, *, step: str | None = None) -> Any:  # type: ignore[override]
        return Context.child(self, name, input, step=step)
