"""Replaying a code workflow's function against its journal: what it has done, what it asks next.

The journal is the list of operations the function issued, in order, as earlier
runs recorded them (each run's new operations are the result of its activation
job, qforge.workflows.durable). A run starts the function from the top: every
operation the journal holds is answered from it (a step's result from its job
row, a value as recorded), and the first that must wait unwinds the function
(`Suspended`) with the new operations it issued on the way. No I/O here.
"""

from __future__ import annotations

import random as random_module
import uuid as uuid_module
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from qforge.events.states import DEAD, JOB_FINISHED, SUCCEEDED

# Operations that become a job of the workflow (a step); the others are values.
STEP_OPS = frozenset({"run", "sleep", "wait", "child"})


class StepFailed(Exception):
    """A step of a code workflow died (retries used up, timed out, cancelled): catch it to go on."""

    def __init__(self, step: str, error: str | None, attempts: int = 0, status: str = DEAD) -> None:
        super().__init__(f"step '{step}' {status}: {error}")
        self.step, self.error, self.attempts, self.status = step, error, attempts, status


class Suspended(BaseException):
    """The function must wait (for steps, a timer or a trigger): unwinds it. A BaseException,
    so that a function's `except Exception` cannot swallow it."""

    def __init__(self, waiting_on: list[str]) -> None:
        super().__init__(f"waiting on {', '.join(waiting_on)}")
        self.waiting_on = waiting_on


class Nondeterministic(BaseException):
    """The function asked for another operation than the journal holds at that point."""


@dataclass(frozen=True)
class StepRecord:
    """What a step's job row says, as the function sees it."""

    status: str
    result: Any = None
    error: str | None = None
    attempts: int = 0


@dataclass(frozen=True)
class Handle:
    """A started step (ctx.start): pass it to ctx.gather for its result."""

    step: str


def describe(op: dict[str, Any]) -> str:
    """An operation as the function wrote it, for messages."""
    kind = op.get("op")
    if kind == "run":
        return f"run({op.get('task')!r}, step={op.get('step')!r})"
    if kind in ("sleep", "wait", "child"):
        return f"{kind}(step={op.get('step')!r})"
    return f"{op.get('of', kind)}()" if kind == "value" else f"version({op.get('change')!r})"


def _same(recorded: dict[str, Any], asked: dict[str, Any]) -> bool:
    keys = ("op", "step", "task", "of", "change", "workflow")
    return all(recorded.get(key) == asked.get(key) for key in keys)


@dataclass
class Replay:
    """One run of the function: the journal it replays and the steps' rows it reads."""

    journal: list[dict[str, Any]]
    steps: dict[str, StepRecord]
    clock: datetime
    cursor: int = 0
    new_ops: list[dict[str, Any]] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=dict)
    versions: dict[str, bool] = field(default_factory=dict)
    last_read: list[str] = field(default_factory=list)  # the steps whose results it read last

    def step_name(self, base: str, explicit: str | None) -> str:
        """`step=` when given, else `base`, `base#2`, `base#3`, ... (contract §7)."""
        if explicit is not None:
            if not isinstance(explicit, str) or not explicit or explicit.startswith("@") or len(explicit) > 200:
                raise ValueError(f"step name {explicit!r}: 1-200 characters, not starting with '@'")
            name = explicit
        else:
            self.counts[base] = self.counts.get(base, 0) + 1
            name = base if self.counts[base] == 1 else f"{base}#{self.counts[base]}"
        if name in self.names:
            raise ValueError(f"step name {name!r} is used twice in this run: give the calls distinct step= names")
        self.names.add(name)
        return name

    def record(self, op: dict[str, Any]) -> dict[str, Any]:
        """The operation at this point: the journal's (which must match), or `op`, new."""
        if self.cursor < len(self.journal):
            recorded = self.journal[self.cursor]
            if not _same(recorded, op):
                raise Nondeterministic(
                    f"step '{recorded.get('step') or op.get('step') or '-'}': the log holds "
                    f"{describe(recorded)} at operation {self.cursor + 1}, the code asked for {describe(op)}")
            self.cursor += 1
            return recorded
        if op["op"] in STEP_OPS:
            op = {**op, "after": list(self.last_read)}
        self.new_ops.append(op)
        self.cursor += 1
        return op

    def replaying(self) -> bool:
        return self.cursor < len(self.journal)

    def outcome(self, names: list[str]) -> list[Any]:
        """The results of these steps in order; StepFailed for the first that failed; Suspended
        while any is unfinished."""
        unfinished = [name for name in names if self._status(name) not in JOB_FINISHED]
        if unfinished:
            raise Suspended(unfinished)
        self.last_read = list(names)
        results = []
        for name in names:
            record = self.steps[name]
            if record.status != SUCCEEDED:
                raise StepFailed(name, record.error, record.attempts, record.status)
            results.append(record.result)
        return results

    def _status(self, name: str) -> str | None:
        record = self.steps.get(name)
        return record.status if record else None

    def value(self, of: str) -> Any:
        """now / uuid / random: recorded once, replayed after."""
        op = self.record({"op": "value", "of": of})
        if "value" not in op:
            op["value"] = _fresh(of, self.clock)
        return op["value"]

    def version(self, change: str) -> bool:
        """True on a run that met the change new; False when the log predates it (Temporal's
        `patched`): the marker is only written when the log has nothing at this point."""
        if change in self.versions:
            return self.versions[change]
        if self.replaying():
            held = self.journal[self.cursor]
            found = held.get("op") == "version" and held.get("change") == change
            if found:
                self.cursor += 1
            self.versions[change] = found
            return found
        self.record({"op": "version", "change": change})
        self.versions[change] = True
        return True


def _fresh(of: str, clock: datetime) -> Any:
    if of == "now":
        return clock.isoformat()
    if of == "uuid":
        return str(uuid_module.uuid4())
    return random_module.SystemRandom().random()
