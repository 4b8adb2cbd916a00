"""`qforge demo`: enqueue a spread of jobs and example workflows through the HTTP API."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from typing import Any

import httpx

from qforge.cli.demo_workflows import CI_PIPELINE, branching_order, pod_workflow


def demo_jobs(run: str) -> list[dict[str, Any]]:
    """Successes, slow jobs, retries that recover, and failures that dead-letter."""
    jobs: list[dict[str, Any]] = []
    for n in range(3):
        jobs.append({"task": "echo", "payload": {"hello": n},
                     "tags": {"order_id": f"{run}-{n}", "demo": run}})
        jobs.append({"task": "add", "payload": {"a": n, "b": 10}, "priority": n,
                     "tags": {"order_id": f"{run}-{n}", "demo": run}})
    jobs += [
        {"task": "slow", "payload": {"seconds": 5}, "tags": {"demo": run}},
        {"task": "slow", "payload": {"seconds": 8}, "queue": "default", "tags": {"demo": run}},
        {"task": "echo", "payload": {"later": True}, "delay_seconds": 10, "tags": {"demo": run}},
        # recovers on its third attempt (backoff 1 s, 2 s)
        {"task": "flaky", "payload": {"fail_times": 2}, "max_retries": 3, "tags": {"demo": run}},
        # runs out of retries: dead-lettered
        {"task": "flaky", "payload": {"fail_times": 5}, "max_retries": 1, "tags": {"demo": run}},
        {"task": "fail", "payload": {"why": "always"}, "max_retries": 2,
         "tags": {"order_id": f"{run}-0", "demo": run}},
        {"task": "fail", "max_retries": 0, "priority": 10, "tags": {"demo": run}},
    ]
    return jobs


def run(args: argparse.Namespace) -> int:
    base = args.api_url.rstrip("/")
    token = os.environ.get("QFORGE_API_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    run = secrets.token_hex(3)
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            return _submit_all(client, base, run)
    except httpx.HTTPError as exc:
        print(f"qforge demo: cannot reach the API at {base}: {exc}", file=sys.stderr)
        return 1


def _post(client: httpx.Client, path: str, body: dict) -> dict:
    response = client.post(path, json=body)
    if response.status_code >= 400:
        raise SystemExit(f"qforge demo: POST {path} -> {response.status_code}: {response.text}")
    return response.json()


def _submit_all(client: httpx.Client, base: str, run: str) -> int:
    print(f"demo run {run} against {base}")
    for spec in demo_jobs(run):
        job = _post(client, "/jobs", spec)
        print(f"  job      {job['id']}  {job['task']:<6} {spec.get('payload', {})}")

    ci = _post(client, "/workflows", {**CI_PIPELINE, "tags": {**CI_PIPELINE["tags"], "demo": run}})
    print(f"  workflow {ci['id']}  ci: build -> (test, lint) -> deploy")

    pod_id = f"wf-demo-{run}"
    _post(client, "/workflow", pod_workflow(pod_id))
    print(f"  workflow {pod_id}  shell DAG A -> (B, C) -> D   (GET /workflow/{pod_id})")

    for choice in ("doB", "doC"):
        order = _post(client, "/workflows", branching_order(f"{run}-{choice}", choice))
        print(f"  workflow {order['id']}  order-fulfilment, X == {choice!r}")
        if choice == "doB":
            waiting = order["id"]
    print()
    print(f"dashboard:       {base}/")
    print(f"search by tag:   curl -s '{base}/executions?tag=order_id:{run}-0'")
    print(f"approve the order (its 'approve' step waits for a trigger):\n"
          f"  curl -s -X POST {base}/workflows/{waiting}/steps/approve/trigger "
          "-H 'content-type: application/json' -d '{\"payload\": {\"approved_by\": \"you\"}}'")
    return 0
