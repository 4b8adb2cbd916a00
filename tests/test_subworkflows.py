"""Sub-workflows (issue 15): a step of type workflow runs a stored definition as a child workflow."""

from __future__ import annotations

import pytest
from psycopg.rows import dict_row

from qforge.workflows import engine as wf
from qforge.workflows.definitions import DefinitionSpec, store_definition
from qforge.commands.errors import Invalid
from qforge.workflows.resume import resume
from qforge.workflows.engine import finish_parents
from qforge.db import connect
from qforge.projections.workflows import get_workflow
from tests.test_workflows import run_ready, status_of, submit

CHILD = {"result": {"step": "sum"}, "steps": [{"step": "sum", "task": "echo", "max_retries": 0}]}


def parent_steps(**child_step) -> list[dict]:
    return [{"step": "prep", "task": "echo"},
            {"step": "child", "type": "workflow", "definition": "child", "depends_on": ["prep"],
             **child_step},
            {"step": "after", "task": "echo", "depends_on": ["child"]}]


def children_of(conn, workflow_id) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM workflows WHERE parent_workflow_id = %s ORDER BY created_at", (workflow_id,))
        return cur.fetchall()


def step(conn, workflow_id, name) -> dict:
    return next(s for s in get_workflow(conn, workflow_id)["steps"] if s["step"] == name)


@pytest.fixture
def child_definition(conn):
    store_definition(conn, "child", DefinitionSpec.model_validate(CHILD))


def test_a_workflow_step_runs_its_child_and_ends_with_its_result(conn, child_definition):
    parent = submit(conn, parent_steps(inputs={"k": "v"}))
    assert run_ready(conn) == ["prep"]
    [child] = children_of(conn, parent)
    assert step(conn, parent, "child")["status"] == "waiting"
    assert step(conn, parent, "child")["child_workflow_id"] == child["id"]
    child_view = get_workflow(conn, child["id"])
    assert child_view["parent"] == {"workflow_id": parent, "step": "child"}
    assert child_view["definition"] == {"name": "child", "version": 1}
    assert run_ready(conn, outputs={"sum": 42}) == ["sum"]
    assert status_of(conn, child["id"]) == "succeeded"
    assert step(conn, parent, "child")["output"] == 42  # ended in the child's own transaction
    assert run_ready(conn) == ["after"]
    assert status_of(conn, parent) == "succeeded"
    payload = conn.execute("SELECT payload FROM jobs WHERE workflow_id = %s", (child["id"],)).fetchone()
    assert payload["payload"]["inputs"] == {"prep": {"step": "prep"}, "k": "v"}


def test_a_failed_child_fails_the_step_and_resume_starts_a_new_child(conn, child_definition):
    parent = submit(conn, parent_steps())
    run_ready(conn)
    run_ready(conn, failures={"sum"})
    assert step(conn, parent, "child")["status"] == "dead"
    assert "child workflow" in step(conn, parent, "child")["error"]
    assert status_of(conn, parent) == "failed"
    resume(conn, parent)
    assert len(children_of(conn, parent)) == 2
    run_ready(conn), run_ready(conn)
    assert status_of(conn, parent) == "succeeded"


def test_cancelling_the_parent_cancels_the_child(conn, child_definition):
    parent = submit(conn, parent_steps())
    run_ready(conn)
    [child] = children_of(conn, parent)
    wf.cancel(conn, parent)
    assert (status_of(conn, parent), status_of(conn, child["id"])) == ("cancelled", "cancelled")


def test_the_monitor_ends_a_parent_step_the_child_could_not(conn, db_url, child_definition):
    parent = submit(conn, parent_steps())
    run_ready(conn)
    with connect(db_url) as busy, busy.transaction():  # someone holds the parent meanwhile
        busy.execute("SELECT 1 FROM workflows WHERE id = %s FOR UPDATE", (parent,))
        run_ready(conn)  # the child ends; its parent is locked: it does not wait
    [child] = children_of(conn, parent)
    assert status_of(conn, child["id"]) == "succeeded"
    assert step(conn, parent, "child")["status"] == "waiting"
    assert finish_parents(conn) == 1
    assert step(conn, parent, "child")["status"] == "succeeded"
    assert finish_parents(conn) == 0


def test_unknown_definitions_and_missing_fields_are_invalid_together(conn):
    with pytest.raises(Invalid) as caught:
        submit(conn, [{"step": "a", "type": "workflow", "definition": "ghost"},
                      {"step": "b", "type": "workflow"},
                      {"step": "c", "task": "echo", "definition": "x"}])
    details = caught.value.details
    assert any("unknown definition 'ghost'" in d for d in details)
    assert any("'definition' is required" in d for d in details)
    assert any("only for a workflow step" in d for d in details)


def test_a_definition_that_starts_itself_stops_at_the_nesting_limit(conn):
    store_definition(conn, "loop", DefinitionSpec.model_validate({"steps": [{"step": "x", "task": "echo"}]}))
    store_definition(conn, "loop", DefinitionSpec.model_validate(
        {"steps": [{"step": "again", "type": "workflow", "definition": "loop"}]}))
    parent = submit(conn, [{"step": "go", "type": "workflow", "definition": "loop"}])
    assert status_of(conn, parent) == "failed"
    assert "nest more than" in get_workflow(conn, parent)["error"]
