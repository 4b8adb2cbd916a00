"""Fan-out: a step with `for_each` runs its task once per element of a list another step produced.

When the DAG rules unblock such a step, it starts waiting (no worker holds it)
and one job per element is enqueued in the same transaction: a job like a
step's, named `step[i]`, with `element_of`/`element_index`, whose payload has
`item` and `index`. At most `max_parallel` are pending at a time, the rest
blocked; each time an element finishes, `progress` unblocks the next ones, ends
the step Succeeded with the list of outputs in order once all succeeded, or
Failed + DeadLettered (so `on_failure` applies) when one died. In the log: the
step's StepUnblocked (status waiting), the elements' Enqueued, their usual job
events, then the step's Succeeded or Failed/DeadLettered.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from qforge.workflows import dag
from qforge.events import types as ev
from qforge.events.ids import new_id
from qforge.events.states import BLOCKED, CANCELLED, DEAD, PENDING, RUNNING, SUCCEEDED, WAITING
from qforge.events.transitions import after, job_cancelled, job_created, job_died, job_succeeded, step_unblocked
from qforge.events.types import NewEvent
from qforge import tracing
from qforge.sql import q
from qforge.workflows.rows import NEVER, over_job_cap

NEVER_ATTEMPT = 0  # the step itself is never claimed: its failure names attempt 0
ELEMENT_DEATHS = frozenset({DEAD, CANCELLED})


def element_name(step: str, index: int) -> str:
    return f"{step}[{index}]"


def items_or_problem(output: Any, for_each: dict[str, Any], max_fan_out: int) -> tuple[list | None, str | None]:
    """The list to fan out over, or why there is none (a pure rule)."""
    items = dag.read_path(output, for_each.get("path"))
    where = f"step '{for_each['step']}' output" + (f" at '{for_each['path']}'" if for_each.get("path") else "")
    if not isinstance(items, list):
        return None, f"for_each: {where} is {type(items).__name__ if items is not None else 'missing'}, not a list"
    if len(items) > max_fan_out:
        return None, (f"for_each: {where} has {len(items)} elements, more than QFORGE_MAX_FAN_OUT"
                      f" ({max_fan_out})")
    return items, None


def element_inputs(inputs: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """An element's `inputs`: the step's, but for the list it runs over (its element is `item`;
    a copy of the whole list in every element would make n elements cost n² to store)."""
    return {name: output for name, output in inputs.items() if name != spec["for_each"]["step"]}


class Fanout:
    """The events of one advance round for a workflow's fan-out steps."""

    def __init__(self, cur, workflow_id: uuid.UUID, clock: datetime) -> None:
        self.cur, self.workflow_id, self.clock = cur, workflow_id, clock  # cur: a dict_row cursor
        self.events: list[NewEvent] = []
        self.created = 0  # elements this round enqueued (not in jobs yet)
        self.again = False  # a step ended in this round: the DAG rules must look again

    def start(self, row: dict, spec: dict[str, Any], inputs: dict[str, Any], source_output: Any,
              max_fan_out: int, max_fan_out_bytes: int | None = None) -> None:
        """The step was just unblocked: wait, and enqueue its elements (or end at once). The step
        fails instead, naming the limit, when its elements would take the workflow over
        QFORGE_MAX_WORKFLOW_JOBS jobs or write more than QFORGE_MAX_FAN_OUT_BYTES of payloads
        (each element carries a copy of the step's payload: a 100 KB payload over 10,000
        elements would be a GB)."""
        unblocked = step_unblocked(row, WAITING, NEVER, inputs=inputs)
        self.events += unblocked
        row = after(row, unblocked)  # waiting: the step's next events follow this one
        if self._summary(row)["total"]:  # resumed: the first run's elements are there, the dead reopened
            self.again = True
            return
        items, problem = items_or_problem(source_output, spec["for_each"], max_fan_out)
        if problem is not None:
            self._fail(row, problem)
            return
        if not items:
            self.events += job_succeeded(row, [])
            self.again = True
            return
        limit = spec.get("max_parallel") or len(items)
        payload = {**row["payload"], "inputs": element_inputs(inputs, spec)}
        problem = self._over_limits(len(items), payload, items, max_fan_out_bytes)
        if problem is not None:
            self._fail(row, problem)
            return
        self.created += len(items)
        # the elements' runs are children of one qforge.fan_out span, in the workflow's trace
        with tracing.span("qforge.fan_out", parent=row.get("trace"), producer=True, workflow_id=self.workflow_id,
                          step=row["step"], elements=len(items)) as traced:
            carrier = traced.carrier
        for index, item in enumerate(items):
            self.events += job_created(
                new_id(), tags=row["tags"], workflow_id=self.workflow_id,
                data=ev.Enqueued(task=row["task"], queue=row["queue"], priority=row["priority"],
                                 max_retries=row["max_retries"], timeout_seconds=row["timeout_seconds"],
                                 run_at=self.clock, payload={**payload, "item": item, "index": index},
                                 status=PENDING if index < limit else BLOCKED,
                                 step=element_name(row["step"], index), step_type="task",
                                 element_of=row["step"], element_index=index,
                                 backoff_base_seconds=row["backoff_base_seconds"],
                                 backoff_cap_seconds=row["backoff_cap_seconds"], trace=carrier))

    def _over_limits(self, count: int, payload: dict[str, Any], items: list, max_bytes: int | None) -> str | None:
        if max_bytes is not None:
            written = count * len(json.dumps(payload, default=str)) + len(json.dumps(items, default=str))
            if written > max_bytes:
                return (f"for_each: {count} elements would write about {written} bytes of payloads, more than"
                        f" QFORGE_MAX_FAN_OUT_BYTES ({max_bytes})")
        over = over_job_cap(self.cur, self.workflow_id, self.created + count)
        if over is not None:
            return (f"for_each: {count} elements would make the workflow's jobs (with its parents' and"
                    f" sub-workflows') {over[0]}, more than QFORGE_MAX_WORKFLOW_JOBS ({over[1]})")
        return None

    def progress(self, row: dict, spec: dict[str, Any]) -> None:
        """A waiting fan-out step: end it, or start the next elements within max_parallel.
        Reads a summary of the elements, then only the rows it acts on."""
        summary = self._summary(row)
        if summary["died"]:
            elements = self._elements(row, [DEAD, CANCELLED, PENDING, RUNNING, BLOCKED, WAITING])
            first = next(e for e in elements if e["status"] in ELEMENT_DEATHS)
            error = (f"element {first['element_index']} {first['status']}"
                     + (f": {first['last_error']}" if first["last_error"] else ""))
            for element in elements:
                if element["status"] not in ELEMENT_DEATHS:
                    self.events += job_cancelled(element, f"fan-out step '{row['step']}' failed")
            self._fail(row, error)
            return
        if summary["succeeded"] == summary["total"]:
            results = [e["result"] for e in self._elements(row, [SUCCEEDED])]
            self.events += job_succeeded(row, results)
            self.again = True
            return
        room = (spec.get("max_parallel") or summary["total"]) - summary["active"]
        if room <= 0 or not summary["blocked"]:
            return
        inputs = element_inputs((row["payload"] or {}).get("inputs", {}), spec)
        for element in self._elements(row, [BLOCKED], limit=room):
            self.events += step_unblocked(element, PENDING, self.clock, inputs=inputs)

    def _summary(self, row: dict) -> dict[str, int]:
        self.cur.execute(q("fanout_summary"), {"workflow_id": self.workflow_id, "step": row["step"]})
        return self.cur.fetchone()

    def _elements(self, row: dict, statuses: list[str], limit: int | None = None) -> list[dict]:
        self.cur.execute(q("fanout_elements"), {"workflow_id": self.workflow_id, "step": row["step"],
                                                "statuses": statuses, "limit": limit})
        return self.cur.fetchall()

    def _fail(self, row: dict, error: str) -> None:
        self.events += job_died(row, "fan_out", error, attempt=row["attempts"] or NEVER_ATTEMPT)
        self.again = True
