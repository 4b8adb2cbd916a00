"""A workflow's rows as the engine reads them: load and lock, step states, when a wait fires, the job cap.

The lower half of the engine (qforge.workflows.engine): what the modules it drives
(fan-out, sub-workflows, code workflows, submit, resume) share, so none of them
imports the engine back.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Callable

from psycopg.rows import dict_row

from qforge.commands.errors import NotFound
from qforge.settings import get_settings
from qforge.sql import q
from qforge.workflows import dag

# A trigger wait without timeout never fires (PostgreSQL's 'infinity' would not load in Python).
NEVER = datetime(9999, 12, 31, tzinfo=timezone.utc)


def wait_until(step_type: str, seconds: float | None, timeout: float | None, now: datetime) -> datetime:
    """When a wait step's timer fires: a sleep ends, a trigger wait times out (or never)."""
    delay = seconds if step_type == "sleep" else timeout
    return NEVER if delay is None else now + timedelta(seconds=delay)


def load(cur, workflow_id: uuid.UUID, *, elements: bool = True) -> tuple[dict, list[dict]]:
    """The workflow's row and its steps' job rows (with the elements of fan-out steps, unless
    elements=False)."""
    conn = cur.connection
    # Both statements in one round trip (a pipeline): each advance of each workflow reads them.
    with conn.cursor(row_factory=cur.row_factory) as steps:
        with conn.pipeline():
            cur.execute(q("workflow_get"), {"id": workflow_id})
            steps.execute(q("workflow_steps" if elements else "workflow_step_rows"), {"id": workflow_id})
        workflow, rows = cur.fetchone(), steps.fetchall()
    if workflow is None:
        raise NotFound(f"workflow {workflow_id} not found")
    return workflow, rows


def load_many(conn, workflow_ids: list[uuid.UUID]) -> Callable[[], dict[uuid.UUID, tuple[dict, list[dict]]]]:
    """What load(elements=False) reads, for several workflows in two statements: sent now (in the
    caller's pipeline, after the statements whose effects they must see), read when the returned
    function is called (after the pipeline's sync)."""
    workflows, steps = conn.cursor(row_factory=dict_row), conn.cursor(row_factory=dict_row)
    workflows.execute(q("workflow_get_many"), {"ids": workflow_ids})
    steps.execute(q("workflow_step_rows_many"), {"ids": workflow_ids})

    def read() -> dict[uuid.UUID, tuple[dict, list[dict]]]:
        with workflows, steps:
            loaded = {row["id"]: (row, []) for row in workflows.fetchall()}
            for row in steps.fetchall():
                loaded[row["workflow_id"]][1].append(row)
        return loaded
    return read


def lock_workflow(cur, workflow_id: uuid.UUID) -> dict:
    """Lock the workflow's row (before any of its jobs: the lock order); NotFound if there is none."""
    cur.execute(q("workflow_lock"), {"ids": [workflow_id]})
    row = cur.fetchone()
    if row is None:
        raise NotFound(f"workflow {workflow_id} not found")
    return row


def step_state(row: dict) -> dag.StepState:
    definition = dag.StepDef(
        name=row["step"], type=row["step_type"] or "task", task=row["task"],
        depends_on=tuple(row["depends_on"] or ()), when=row["condition"],
        on_failure=row["on_failure"], seconds=row["sleep_seconds"])
    return dag.StepState(definition, row["status"], row["result"], row["last_error"])


def split_elements(rows: list[dict]) -> tuple[list[dict], dict[str, list[dict]]]:
    """A workflow's job rows: its steps, and the elements of each fan-out step."""
    steps = [row for row in rows if not row.get("element_of")]
    elements: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("element_of"):
            elements.setdefault(row["element_of"], []).append(row)
    return steps, elements


def over_job_cap(cur, workflow_id: uuid.UUID, adding: int = 0, *, known: int | None = None) -> tuple[int, int] | None:
    """The one job cap: (jobs, limit) when the tree of `workflow_id` (its root's jobs and every
    sub-workflow's, fan-out elements and code workflows' activations included) with `adding`
    more jobs would hold more than QFORGE_MAX_WORKFLOW_JOBS, else None. A fan-out, a
    sub-workflow and a code workflow's new steps all ask it before they add jobs (each names the
    limit in its own words): 1,000 steps each starting 1,000 more would otherwise multiply a
    small request into a billion jobs. `cur`: a dict_row cursor. `known`: the tree's jobs when the
    caller holds them all (a workflow alone in its tree, its rows locked and read): no count then."""
    limit = get_settings().max_workflow_jobs
    if known is None:
        cur.execute(q("workflow_tree_job_count"), {"id": workflow_id})
        known = cur.fetchone()["count"]
    jobs = known + adding
    return (jobs, limit) if jobs > limit else None
