"""Issue 15 end to end with real `qforge worker` and `qforge monitor` processes: resume, results, deadlines."""

from __future__ import annotations

from qforge.workflows import engine as wf
from qforge.workflows.resume import resume
from qforge.projections.workflows import get_workflow
from test_worker_support import Processes, procs, registry, tasks_dir, wait_for  # noqa: F401 (fixtures)
from tests.test_workflows_e2e import finished, steps


def test_resume_reruns_only_the_failed_part_with_real_workers(conn, procs: Processes):
    procs.worker("--concurrency", "2")
    workflow_id = wf.submit(conn, wf.WorkflowSpec.model_validate({
        "name": "resume-e2e", "result": {"step": "report", "path": "inputs"}, "steps": [
            {"step": "fetch", "task": "echo", "payload": {"rows": 3}},
            {"step": "flaky", "task": "flaky", "payload": {"fail_times": 1}, "max_retries": 0,
             "depends_on": ["fetch"]},
            {"step": "report", "task": "echo", "depends_on": ["flaky"]}]}))[0]
    assert wait_for(lambda: finished(conn, workflow_id), timeout=20,
                    message="the first run to fail") == "failed"
    first = steps(conn, workflow_id)
    assert (first["flaky"]["status"], first["report"]["status"]) == ("dead", "skipped")
    assert resume(conn, workflow_id) == ["flaky", "report"]
    assert wait_for(lambda: finished(conn, workflow_id), timeout=20,
                    message="the resumed run to finish") == "succeeded"
    second = steps(conn, workflow_id)
    assert second["fetch"]["attempts"] == 1 and second["fetch"]["version"] == first["fetch"]["version"]
    assert second["flaky"]["attempts"] == 2
    view = get_workflow(conn, workflow_id)
    assert view["result"] == {"flaky": second["flaky"]["result"]}


def test_deadline_stops_a_running_step_and_fails_the_workflow(conn, procs: Processes):
    procs.worker("--concurrency", "2", "--name", "deadline-worker")
    procs.monitor()
    # the step must be running when the deadline passes: submit once the worker is there
    wait_for(lambda: registry(conn, "deadline-worker"), timeout=15, message="the worker to register")
    workflow_id = wf.submit(conn, wf.WorkflowSpec.model_validate({
        "name": "deadline-e2e", "deadline_seconds": 2, "steps": [
            {"step": "long", "task": "slow", "payload": {"seconds": 60}},
            {"step": "after", "task": "echo", "depends_on": ["long"]}]}))[0]
    assert wait_for(lambda: finished(conn, workflow_id), timeout=20,
                    message="the deadline to fail the workflow") == "failed"
    state = steps(conn, workflow_id)
    assert (state["long"]["status"], state["after"]["status"]) == ("cancelled", "skipped")
    assert get_workflow(conn, workflow_id)["error"].startswith("deadline")


def test_fan_out_over_a_runtime_list_with_real_workers(conn, procs: Processes):
    procs.worker("--concurrency", "4")
    workflow_id = wf.submit(conn, wf.WorkflowSpec.model_validate({
        "name": "fan-e2e", "result": {"step": "sum"}, "steps": [
            {"step": "list", "task": "echo", "payload": {"pairs": [[1, 2], [3, 4], [5, 6], [7, 8]]}},
            {"step": "add", "task": "echo", "for_each": {"step": "list", "path": "pairs"},
             "max_parallel": 2},
            {"step": "sum", "task": "echo", "depends_on": ["add"]}]}))[0]
    assert wait_for(lambda: finished(conn, workflow_id), timeout=20,
                    message="the fan-out workflow to finish") == "succeeded"
    view = get_workflow(conn, workflow_id)
    add = next(s for s in view["steps"] if s["step"] == "add")
    assert add["elements"]["counts"] == {"succeeded": 4}
    assert view["result"]["inputs"]["add"] == add["output"]
    assert [item["index"] for item in add["elements"]["items"]] == [0, 1, 2, 3]
    assert [(out["index"], out["item"]) for out in add["output"]] == [
        (0, [1, 2]), (1, [3, 4]), (2, [5, 6]), (3, [7, 8])]


def test_sub_workflow_from_a_stored_definition_with_real_workers(conn, procs: Processes):
    from qforge.workflows.definitions import DefinitionSpec, store_definition
    from qforge.workflows.engine import start_definition
    procs.worker("--concurrency", "2")
    procs.monitor()
    store_definition(conn, "child", DefinitionSpec.model_validate({
        "result": {"step": "sum"}, "steps": [{"step": "sum", "task": "add", "payload": {"a": 2, "b": 3}}]}))
    store_definition(conn, "parent", DefinitionSpec.model_validate({
        "result": {"step": "call"}, "steps": [{"step": "call", "type": "workflow", "definition": "child"}]}))
    workflow_id = start_definition(conn, "parent", {"n": 1}, actor="e2e")
    assert wait_for(lambda: finished(conn, workflow_id), timeout=20,
                    message="the parent to finish") == "succeeded"
    view = get_workflow(conn, workflow_id)
    assert view["result"] == 5
    child = get_workflow(conn, view["steps"][0]["child_workflow_id"])
    assert (child["status"], child["parent"]["workflow_id"]) == ("succeeded", workflow_id)


def test_compound_conditions_and_otherwise_with_real_workers(conn, procs: Processes):
    procs.worker("--concurrency", "4")
    workflow_id = wf.submit(conn, wf.WorkflowSpec.model_validate({"name": "route-e2e", "steps": [
        {"step": "r", "task": "echo", "payload": {"route": "z", "size": 5}},
        {"step": "small_b", "task": "echo", "when": {"all": [
            {"step": "r", "path": "route", "equals": "b"}, {"not": {"step": "r", "path": "size", "in": [5]}}]}},
        {"step": "c_or_big", "task": "echo", "when": {"any": [
            {"step": "r", "path": "route", "equals": "c"}, {"step": "r", "path": "size", "equals": 5}]}},
        {"step": "fallback", "task": "echo", "depends_on": ["r"], "when": "otherwise"}]}))[0]
    assert wait_for(lambda: finished(conn, workflow_id), timeout=20,
                    message="the routed workflow to finish") == "succeeded"
    state = steps(conn, workflow_id)
    assert {name: row["status"] for name, row in state.items()} == {
        "r": "succeeded", "small_b": "skipped", "c_or_big": "succeeded", "fallback": "skipped"}


def test_waiting_on_a_trigger_with_real_workers(conn, procs: Processes):
    procs.worker("--concurrency", "2")
    workflow_id = wf.submit(conn, wf.WorkflowSpec.model_validate({"name": "wait-e2e", "steps": [
        {"step": "prep", "task": "echo"},
        {"step": "approve", "type": "wait_for_trigger", "depends_on": ["prep"]},
        {"step": "ship", "task": "echo", "depends_on": ["approve"]}]}))[0]
    waits = wait_for(lambda: get_workflow(conn, workflow_id)["waiting_on"], timeout=15,
                     message="the workflow to wait on its trigger")
    assert waits == [{"step": "approve", "kind": "trigger"}]
    wf.trigger(conn, workflow_id, "approve", {"ok": True})
    assert wait_for(lambda: finished(conn, workflow_id), timeout=15, message="the workflow to finish") == "succeeded"
    assert get_workflow(conn, workflow_id)["waiting_on"] == []
