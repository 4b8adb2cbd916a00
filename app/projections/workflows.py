"""The workflows read model as the API shows it: one workflow with its steps, and lists."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from qforge.events.states import BLOCKED, CANCELLED, DEAD, JOB_ACTIVE, RUNNING, SKIPPED, SUCCEEDED, WAITING
from qforge.projections.pages import fetch_page
from qforge.sql import q
from qforge.workflows import journal as code_journal

NEVER_YEAR = 9999  # a trigger wait without timeout waits "until" 9999-12-31: no until

# GET /workflows/{id}.
WORKFLOW_FIELDS = ("id", "name", "status", "tags", "created_at", "finished_at", "error", "result",
                   "deadline_seconds", "deadline_at", "code", "input")
STEP_FIELDS = ("step", "status", "job_id", "depends_on", "output", "error", "attempts",
               "started_at", "finished_at")


# What GET /workflows/{id} shows of a step as it was declared (from the workflow's definition).
DECLARED_FIELDS = ("seconds", "for_each", "max_parallel", "definition", "inputs")


def step_view(row: dict[str, Any], declared: dict[str, Any] | None = None) -> dict[str, Any]:
    """A step's job row in the contract's step shape (started_at: claim, or when a wait began);
    `declared` is the step as submitted."""
    return {k: (declared or {}).get(k) for k in DECLARED_FIELDS} | {
        "step": row["step"], "status": row["status"], "job_id": row["id"],
        "depends_on": list(row.get("depends_on") or []), "output": row.get("result"),
        "error": row.get("last_error"), "attempts": row.get("attempts", 0),
        "started_at": row.get("started_at"), "finished_at": row.get("finished_at"),
        # beyond the contract: what the dashboard needs to draw the DAG
        "type": row.get("step_type") or "task", "when": row.get("condition"),
        "on_failure": row.get("on_failure"),
        "task": row.get("task") if (row.get("step_type") or "task") == "task" else None,
    }


def ordered_steps(workflow: dict[str, Any], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps in the order the definition declared them (a code workflow's: as its function
    scheduled them; its activations are not steps)."""
    if workflow.get("code"):
        order = code_journal.step_order(steps)
        return sorted((r for r in steps if not code_journal.is_activation(r)),
                      key=lambda row: (order.get(row["step"], len(order)), row["step"] or ""))
    declared = [s.get("step") for s in workflow.get("definition") or [] if isinstance(s, dict)]
    rank = {name: index for index, name in enumerate(declared)}
    return sorted(steps, key=lambda row: (rank.get(row["step"], len(rank)), row["step"] or ""))


# waiting_on kinds: the step type that waits for each
WAIT_KINDS = {"trigger": "wait_for_trigger", "timer": "sleep"}


def waiting_on(workflow: dict[str, Any], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a running workflow waits for when its only unfinished steps that can move are
    trigger or timer waits (blocked steps behind them do not count); else []."""
    if workflow.get("status") != RUNNING:
        return []
    kinds = {step_type: kind for kind, step_type in WAIT_KINDS.items()}
    waits, busy = [], False
    for row in steps:
        if row["status"] == WAITING and row.get("step_type") in kinds:
            until = row.get("run_at")
            waits.append({"step": row["step"], "kind": kinds[row["step_type"]],
                          **({"until": until} if until and until.year < NEVER_YEAR else {})})
        elif row["status"] in JOB_ACTIVE and row["status"] != BLOCKED:
            busy = True  # due, running, or waiting for a fan-out or a child
    return [] if busy else waits


def elements_view(elements: list[dict[str, Any]]) -> dict[str, Any]:
    """A fan-out step's elements: how many in each status, and each one (index order)."""
    counts: dict[str, int] = {}
    for row in elements:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return {"total": len(elements), "counts": counts, "items": [
        {"index": row["element_index"], "job_id": row["id"], "status": row["status"],
         "attempts": row.get("attempts", 0), "error": row.get("last_error")}
        for row in sorted(elements, key=lambda r: r["element_index"])]}


def workflow_view(workflow: dict[str, Any], rows: list[dict[str, Any]],
                  children: dict[Any, Any] | None = None) -> dict[str, Any]:
    """A workflows row and its step rows (live or as of a position) in the contract's shape; the
    elements of a fan-out step are shown within it, not as steps; `children` (step job id ->
    sub-workflow id) links workflow steps to their latest child."""
    view = {name: workflow.get(name) for name in WORKFLOW_FIELDS}
    view["waiting_on"] = waiting_on(workflow, [row for row in rows if not row.get("element_of")])

    view["parent"] = ({"workflow_id": workflow["parent_workflow_id"], "step": workflow["parent_step"]}
                      if workflow.get("parent_workflow_id") else None)
    view["definition"] = ({"name": workflow["definition_name"], "version": workflow["definition_version"]}
                          if workflow.get("definition_name") else None)
    steps = [row for row in rows if not row.get("element_of")]
    elements: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("element_of"):
            elements.setdefault(row["element_of"], []).append(row)
    fanned = {s.get("step") for s in workflow.get("definition") or []
              if isinstance(s, dict) and s.get("for_each")}
    declared = {s.get("step"): s for s in workflow.get("definition") or [] if isinstance(s, dict)}
    view["steps"] = [step_view(row, declared.get(row["step"])) | ({"elements": elements_view(elements.get(row["step"], []))}
                                       if row["step"] in fanned else {})
                     | ({"child_workflow_id": (children or {}).get(row["id"])}
                        if row.get("step_type") == "workflow" else {})
                     | ({"input": row.get("payload")} if workflow.get("code") else {})
                     for row in ordered_steps(workflow, steps)]
    view["outcome"] = outcome(view)
    return view


# How a step's end reads in a sentence.
ENDED = {DEAD: "died", CANCELLED: "was cancelled", SKIPPED: "was skipped", SUCCEEDED: "succeeded"}


def outcome(view: dict[str, Any]) -> str | None:
    """Why the workflow ended as it did, in a sentence (None while it runs). The rule
    (docs/workflows.md): it succeeds when every step succeeded or was skipped, except
    dead steps whose on_failure handler succeeded; a step after a dead one is skipped."""
    status = view.get("status")
    if status == RUNNING or status is None:
        return None
    steps = {step["step"]: step for step in view.get("steps") or []}
    said = [f"{name} died; its handler {step['on_failure']} "
            f"{ENDED.get(steps.get(step['on_failure'], {}).get('status'), 'did not run')}"
            for name, step in steps.items() if step["status"] == DEAD and step.get("on_failure")]
    said += [f"{name} died with no on_failure handler" for name, step in steps.items()
             if step["status"] == DEAD and not step.get("on_failure")]
    for name, step in steps.items():
        if step["status"] != SKIPPED:
            continue
        blockers = [dep for dep in step.get("depends_on") or []
                    if steps.get(dep, {}).get("status") in (DEAD, CANCELLED)]
        if blockers:
            said.append(f"{name} was skipped because {' and '.join(blockers)} "
                        f"{ENDED[steps[blockers[0]]['status']] if len(blockers) == 1 else 'did not succeed'}")
    if status == SUCCEEDED:
        rule = ("every step succeeded or was skipped" if not any(s["status"] == DEAD for s in steps.values())
                else "a death whose handler succeeds does not fail the workflow")
        return f"succeeded: {rule}" + (f" ({'; '.join(said)})" if said else "")
    if status == CANCELLED:
        return "cancelled" + (f" ({'; '.join(said)})" if said else "")
    reason = view.get("error") or "; ".join(said)
    return f"{status}: {reason}" if reason else status


def get_workflow_rows(conn, workflow_id: UUID) -> tuple[dict, list[dict]] | None:
    """The workflow's row and its steps' job rows, declared order; None if unknown."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("workflow_get"), {"id": workflow_id})
        workflow = cur.fetchone()
        if workflow is None:
            return None
        cur.execute(q("workflow_steps"), {"id": workflow_id})
        rows = cur.fetchall()
        if workflow.get("code"):  # a code workflow's order comes from its activations: keep them
            return workflow, rows
        return workflow, ordered_steps(workflow, rows)


def get_workflow(conn, workflow_id: UUID) -> dict[str, Any] | None:
    found = get_workflow_rows(conn, workflow_id)
    if found is None:
        return None
    children: dict[Any, Any] = {}
    if any(row.get("step_type") == "workflow" for row in found[1]):
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(q("workflow_children"), {"id": workflow_id})
            for child in cur.fetchall():  # oldest first: a resumed step's newest child wins
                children[child["parent_job_id"]] = child["id"]
    return workflow_view(*found, children=children)


def summary_view(row: dict[str, Any], counts: dict[str, int],
                 element_counts: dict[str, int] | None = None) -> dict[str, Any]:
    """A list item: the workflow without its steps, with how many steps are in each status
    (as its page counts them: a fan-out step once) and how many fan-out elements."""
    return {"id": row["id"], "name": row["name"], "status": row["status"], "tags": row["tags"],
            "error": row["error"], "created_at": row["created_at"],
            "updated_at": row["updated_at"], "finished_at": row["finished_at"],
            "step_counts": counts, "element_counts": element_counts or {}}


def summaries(conn, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    counts: dict[UUID, dict[str, int]] = {row["id"]: {} for row in rows}
    elements: dict[UUID, dict[str, int]] = {row["id"]: {} for row in rows}
    if rows:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(q("workflow_step_counts"), {"ids": list(counts)})
            for found in cur.fetchall():
                into = elements if found["element"] else counts
                into[found["workflow_id"]][found["status"]] = found["n"]
    return [summary_view(row, counts[row["id"]], elements[row["id"]]) for row in rows]


def list_workflows(conn, *, status: str | None = None, tags: list[tuple[str, str]] | None = None,
                   limit: int = 50, cursor: str | None = None,
                   name: str | None = None) -> tuple[list[dict], str | None]:
    """Newest first; (items, next cursor or None). ValueError for a malformed cursor."""
    rows, next_cursor = fetch_page(conn, "workflows_list", {"status": status, "name": name},
                                   tags=tags, limit=limit, cursor=cursor)
    return summaries(conn, rows), next_cursor


def workflows_by_ids(conn, ids: list[UUID]) -> dict[UUID, dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("workflows_by_ids"), {"ids": ids})
        rows = cur.fetchall()
    return {item["id"]: item for item in summaries(conn, rows)}
