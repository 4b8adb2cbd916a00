"""Fan-out (`for_each`) through the commands: one job per element, max_parallel, outputs in order, failure."""

from __future__ import annotations

import pytest
from psycopg.rows import dict_row

from qforge.commands.errors import Invalid
from qforge.workflows.fanout import items_or_problem
from qforge.commands.manage import retry_job
from qforge.workflows.resume import resume
from qforge.projections.workflows import get_workflow
from qforge.settings import get_settings
from tests.test_workflows import run_ready, status_of, submit


def fan(max_parallel=None, **extra) -> list[dict]:
    step = {"step": "each", "task": "echo", "for_each": {"step": "list", "path": "items"},
            "max_retries": 0, **extra}
    if max_parallel:
        step["max_parallel"] = max_parallel
    return [{"step": "list", "task": "echo"}, step,
            {"step": "after", "task": "echo", "depends_on": ["each"]}]


def elements(conn, workflow_id) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM jobs WHERE workflow_id = %s AND element_of IS NOT NULL"
                    " ORDER BY element_index", (workflow_id,))
        return cur.fetchall()


def step_view(conn, workflow_id, name) -> dict:
    return next(s for s in get_workflow(conn, workflow_id)["steps"] if s["step"] == name)


def test_each_element_runs_once_and_the_output_is_the_list_in_order(conn):
    workflow_id = submit(conn, fan(), result={"step": "each"})
    run_ready(conn, outputs={"list": {"items": ["x", "y", "z"]}})
    assert step_view(conn, workflow_id, "each")["status"] == "waiting"
    ran = run_ready(conn, outputs={"each[0]": 0, "each[1]": 10, "each[2]": 20})
    assert ran == ["each[0]", "each[1]", "each[2]"]
    payloads = [(e["payload"]["item"], e["payload"]["index"]) for e in elements(conn, workflow_id)]
    assert payloads == [("x", 0), ("y", 1), ("z", 2)]
    # the list is not copied into every element (n elements would cost n² to store)
    assert all(e["payload"]["inputs"] == {} for e in elements(conn, workflow_id))
    assert run_ready(conn) == ["after"]
    view = get_workflow(conn, workflow_id)
    assert view["status"] == "succeeded" and view["result"] == [0, 10, 20]
    each = step_view(conn, workflow_id, "each")
    assert each["elements"]["counts"] == {"succeeded": 3} and each["output"] == [0, 10, 20]
    assert [s["step"] for s in view["steps"]] == ["list", "each", "after"]  # elements are not steps


def test_max_parallel_bounds_the_elements_running_at_once(conn):
    workflow_id = submit(conn, fan(max_parallel=2))
    run_ready(conn, outputs={"list": {"items": list(range(5))}})
    rounds = []
    while status_of(conn, workflow_id) == "running":
        ran = run_ready(conn)
        assert ran, "nothing ran"
        rounds.append(ran)
    assert [len(r) for r in rounds] == [2, 2, 1, 1]  # the last round is `after`
    assert status_of(conn, workflow_id) == "succeeded"


def test_an_element_that_dies_fails_the_step_and_its_handler_runs(conn):
    steps = fan(on_failure="cleanup") + [{"step": "cleanup", "task": "echo"}]
    workflow_id = submit(conn, steps, **{})
    run_ready(conn, outputs={"list": {"items": [1, 2]}})
    run_ready(conn, failures={"each[1]"})
    each = step_view(conn, workflow_id, "each")
    assert each["status"] == "dead" and "element 1 dead" in each["error"]
    assert run_ready(conn) == ["cleanup"]
    assert status_of(conn, workflow_id) == "succeeded"
    assert step_view(conn, workflow_id, "after")["status"] == "skipped"


def test_resume_reruns_only_the_dead_elements(conn):
    workflow_id = submit(conn, fan())
    run_ready(conn, outputs={"list": {"items": ["a", "b", "c"]}})
    run_ready(conn, failures={"each[1]"})
    assert status_of(conn, workflow_id) == "failed"
    resume(conn, workflow_id)
    assert run_ready(conn) == ["each[1]"]
    assert run_ready(conn) == ["after"]
    assert status_of(conn, workflow_id) == "succeeded"
    assert [e["attempts"] for e in elements(conn, workflow_id)] == [1, 2, 1]


def test_retry_of_a_dead_element_reopens_its_step_and_workflow(conn):
    workflow_id = submit(conn, fan())
    run_ready(conn, outputs={"list": {"items": ["a", "b"]}})
    run_ready(conn, failures={"each[0]"})
    retry_job(conn, elements(conn, workflow_id)[0]["id"])
    assert run_ready(conn) == ["each[0]"]
    assert run_ready(conn) == ["after"]
    assert status_of(conn, workflow_id) == "succeeded"


def test_an_empty_list_succeeds_at_once_and_a_non_list_fails_clearly(conn):
    empty = submit(conn, fan())
    run_ready(conn, outputs={"list": {"items": []}})
    assert step_view(conn, empty, "each")["output"] == []
    assert run_ready(conn) == ["after"]
    assert status_of(conn, empty) == "succeeded"
    bad = submit(conn, fan())
    run_ready(conn, outputs={"list": {"items": "nope"}})
    assert status_of(conn, bad) == "failed"
    assert "not a list" in step_view(conn, bad, "each")["error"]


def test_a_list_longer_than_the_limit_fails_the_step(conn, monkeypatch):
    monkeypatch.setenv("QFORGE_MAX_FAN_OUT", "3")
    assert get_settings().max_fan_out == 3
    workflow_id = submit(conn, fan())
    run_ready(conn, outputs={"list": {"items": [1, 2, 3, 4]}})
    assert status_of(conn, workflow_id) == "failed"
    assert "QFORGE_MAX_FAN_OUT" in step_view(conn, workflow_id, "each")["error"]
    assert elements(conn, workflow_id) == []


def test_items_or_problem_reads_the_path():
    assert items_or_problem({"a": {"b": [1]}}, {"step": "s", "path": "a.b"}, 5) == ([1], None)
    assert items_or_problem([1, 2], {"step": "s"}, 5) == ([1, 2], None)
    assert "missing" in items_or_problem({}, {"step": "s", "path": "x"}, 5)[1]


def test_for_each_is_validated_with_the_graph(conn):
    with pytest.raises(Invalid) as caught:
        submit(conn, [{"step": "a", "task": "echo", "for_each": {"step": "ghost"}},
                      {"step": "w", "type": "sleep", "seconds": 1, "for_each": {"step": "a"}}])
    details = caught.value.details
    assert any("'for_each' names unknown step 'ghost'" in p for p in details)
    with pytest.raises(Invalid) as caught:
        submit(conn, [{"step": "a", "task": "echo", "max_parallel": 2, "inputs": {"x": 1}}])
    assert len(caught.value.details) == 2
    assert any("for_each needs a task step" in p for p in details)
