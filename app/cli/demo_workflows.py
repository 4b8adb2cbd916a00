"""The demo's workflows, as data: a CI pipeline, the pod orchestrator's example, conditional edges and waits."""

from __future__ import annotations

from typing import Any

# A CI pipeline: deploy runs only after test AND lint, which run after build.
CI_PIPELINE: dict[str, Any] = {
    "name": "ci",
    "tags": {"pipeline": "ci"},
    "steps": [
        {"step": "build", "task": "echo", "payload": {"artifact": "qforge.tar.gz"}},
        {"step": "test", "task": "echo", "depends_on": ["build"]},
        {"step": "lint", "task": "echo", "depends_on": ["build"]},
        {"step": "deploy", "task": "echo", "depends_on": ["test", "lint"]},
    ],
}


# The pod orchestrator's example: A runs first, B and C in parallel once A completes, D after both
# (POST /workflow, the pod orchestrator's API; each command runs as a shell step).
def pod_workflow(workflow_id: str) -> dict[str, Any]:
    return {
        "workflowId": workflow_id,
        "steps": [
            {"id": "A", "command": "echo hello"},
            {"id": "B", "command": "ls /", "dependsOn": ["A"]},
            {"id": "C", "command": "pwd", "dependsOn": ["A"]},
            {"id": "D", "command": "date", "dependsOn": ["B", "C"]},
        ],
    }


# Conditional edges: call B only when A's output X == 'doB', C only when X == 'doC';
# a failure handler; a trigger wait and a time wait.
def branching_order(order_id: str, choice: str = "doB") -> dict[str, Any]:
    return {
        "name": "order-fulfilment",
        "tags": {"order_id": order_id},
        "steps": [
            {"step": "classify", "task": "echo", "payload": {"X": choice, "order_id": order_id}},
            {"step": "ship_b", "task": "echo", "payload": {"route": "B"},
             "when": {"step": "classify", "path": "X", "equals": "doB"}},
            {"step": "ship_c", "task": "echo", "payload": {"route": "C"},
             "when": {"step": "classify", "path": "X", "equals": "doC"}},
            # Always fails; its handler runs and the workflow still succeeds.
            {"step": "charge_card", "task": "fail", "payload": {"reason": "card declined"},
             "depends_on": ["ship_b"], "max_retries": 1, "on_failure": "refund"},
            {"step": "refund", "task": "echo", "payload": {"action": "refund"}},
            {"step": "approve", "type": "wait_for_trigger", "depends_on": ["ship_b"]},
            {"step": "cool_down", "type": "sleep", "seconds": 3, "depends_on": ["approve"]},
            {"step": "notify", "task": "echo", "payload": {"message": "order done"},
             "depends_on": ["cool_down"]},
        ],
    }
