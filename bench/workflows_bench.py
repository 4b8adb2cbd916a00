"""Workflow commands at scale (issue 15): start and complete a 10,000-element fan-out, resume a wide failed workflow.

Usage: python bench/workflows_bench.py DATABASE_URL   (a migrated database of its own; it leaves its rows there)
"""
import sys
import time

from qforge.db import connect
from qforge.workflows import engine as wf
from qforge.commands.claim import claim
from qforge.commands.report import Report, complete, fail
from qforge.workflows.resume import resume

url = sys.argv[1]
with connect(url, autocommit=True) as conn:
    wid = wf.submit(conn, wf.WorkflowSpec.model_validate({"name": "bench", "steps": [
        {"step": "list", "task": "echo", "queue": "bench15"},
        {"step": "each", "task": "echo", "queue": "bench15", "for_each": {"step": "list", "path": "items"}}]}))[0]
    [job] = claim(conn, ["bench15"], 1, "w")
    t = time.perf_counter()
    complete(conn, [Report(job.id, job.attempt, result={"items": list(range(10_000))}, workflow_id=wid)],
             actor="w", workflow_ids_known=True)
    print(f"fan-out of 10,000 elements started in {time.perf_counter() - t:.2f}s")
    steps = [{"step": f"s{i}", "task": "echo", "queue": "bench15r", "max_retries": 0} for i in range(200)]
    wid = wf.submit(conn, wf.WorkflowSpec.model_validate({"name": "wide", "steps": steps}))[0]
    jobs = claim(conn, ["bench15r"], 200, "w")
    complete(conn, [Report(j.id, j.attempt, result=1, workflow_id=wid) for j in jobs[:100]], actor="w", workflow_ids_known=True)
    fail(conn, [Report(j.id, j.attempt, error="x", workflow_id=wid) for j in jobs[100:]], actor="w", workflow_ids_known=True)
    t = time.perf_counter()
    names = resume(conn, wid)
    print(f"resume of a failed 200-step workflow ({len(names)} steps reopened) in {time.perf_counter() - t:.3f}s")
    # complete the 10,000 elements, 100 per report batch (as a worker pool batches them)
    t = time.perf_counter()
    done = 0
    while True:
        batch = claim(conn, ["bench15"], 100, "w")
        if not batch:
            break
        complete(conn, [Report(j.id, j.attempt, result=j.payload["index"], workflow_id=j.workflow_id)
                        for j in batch], actor="w", workflow_ids_known=True)
        done += len(batch)
    print(f"{done} elements claimed and completed in batches of 100 in {time.perf_counter() - t:.1f}s")
