"""Property test over random workflows run by the commands (issue 15): with fan-out, sub-workflows,
resume and deadlines in the mix, every run ends, each task runs at most once per attempt, and
resume never runs a succeeded step again."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from qforge.workflows import engine as wf
from qforge.commands.claim import claim
from qforge.workflows.definitions import DefinitionSpec, store_definition
from qforge.commands.errors import Conflict
from qforge.commands.report import Report, complete, fail
from qforge.workflows.resume import resume
from qforge.events.states import JOB_ACTIVE, WORKFLOW_FINISHED

START = datetime(2031, 1, 1, tzinfo=timezone.utc)
ROUND = timedelta(hours=1)  # beyond any backoff: a retry is due the next round


@st.composite
def workflows(draw) -> dict:
    count = draw(st.integers(2, 6))
    steps: list[dict] = []
    for i in range(count):
        deps = sorted(draw(st.sets(st.sampled_from([s["step"] for s in steps]), max_size=2))) if steps else []
        kind = draw(st.sampled_from(["task", "task", "fan", "child"]))
        step: dict = {"step": f"s{i}", "max_retries": draw(st.integers(0, 1))}
        if deps:
            step["depends_on"] = deps
        if kind == "child":
            step.update(type="workflow", definition="child")
            del step["max_retries"]
        else:
            step["task"] = "echo"
            if kind == "fan" and deps:
                step["for_each"] = {"step": deps[0], "path": "items"}
                if draw(st.booleans()):
                    step["max_parallel"] = draw(st.integers(1, 2))
        steps.append(step)
    body: dict = {"name": "prop", "steps": steps}
    if draw(st.booleans()):
        body["deadline_seconds"] = draw(st.integers(2, 6)) * ROUND.total_seconds()
    return body


def _run(conn, rng: random.Random, body: dict) -> tuple:
    clock = START
    workflow_id = wf.submit(conn, wf.WorkflowSpec.model_validate(body), now=clock)[0]
    resumes = 0
    for _ in range(300):
        clock += ROUND
        jobs = claim(conn, ["default"], rng.randint(1, 4), "w", now=clock)
        broken = [j for j in jobs if rng.random() < 0.2]
        fine = [j for j in jobs if j not in broken]
        complete(conn, [Report(j.id, j.attempt, result={"items": list(range(rng.randint(0, 3)))},
                               workflow_id=j.workflow_id) for j in fine],
                 actor="w", now=clock, workflow_ids_known=True)
        fail(conn, [Report(j.id, j.attempt, error="boom", workflow_id=j.workflow_id) for j in broken],
             actor="w", now=clock, workflow_ids_known=True)
        wf.fire_deadlines(conn, now=clock)
        status = conn.execute("SELECT status FROM workflows WHERE id = %s", (workflow_id,)).fetchone()["status"]
        if status in WORKFLOW_FINISHED:
            if status == "succeeded" or resumes >= 2:
                return workflow_id, status
            try:
                resume(conn, workflow_id, now=clock)
                resumes += 1
            except Conflict:
                return workflow_id, status  # nothing to run again
    raise AssertionError("the workflow never ended")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=workflows(), seed=st.integers(0, 2**32 - 1))
def test_random_workflows_end_run_each_attempt_once_and_resume_keeps_successes(conn, body, seed):
    if not conn.execute("SELECT 1 FROM definitions WHERE name = 'child'").fetchone():
        store_definition(conn, "child", DefinitionSpec.model_validate(
            {"result": {"step": "c"}, "steps": [{"step": "c", "task": "echo", "max_retries": 0}]}))
    workflow_id, _ = _run(conn, random.Random(seed), body)
    with conn.cursor(row_factory=dict_row) as cur:
        # the workflow and all its sub-workflows, recursively
        cur.execute("""WITH RECURSIVE tree AS (SELECT id FROM workflows WHERE id = %s
                        UNION ALL SELECT w.id FROM workflows w JOIN tree t ON w.parent_workflow_id = t.id)
                       SELECT id FROM tree""", (workflow_id,))
        tree = [row["id"] for row in cur.fetchall()]
        cur.execute("SELECT status FROM workflows WHERE id = ANY(%s)", (tree,))
        assert all(row["status"] in WORKFLOW_FINISHED for row in cur.fetchall()), "a sub-workflow still runs"
        cur.execute("SELECT id, status FROM jobs WHERE workflow_id = ANY(%s)", (tree,))
        jobs = cur.fetchall()
        assert not [j for j in jobs if j["status"] in JOB_ACTIVE], "a step was left unfinished"
        cur.execute("SELECT stream_id, type, data FROM events WHERE workflow_id = ANY(%s) AND stream_type = 'job'"
                    " ORDER BY position", (tree,))
        streams: dict = {}
        for event in cur.fetchall():
            streams.setdefault(event["stream_id"], []).append(event)
    for events in streams.values():
        attempts = [int(e["data"]["attempt"]) for e in events if e["type"] == "Claimed"]
        assert len(attempts) == len(set(attempts)), "an attempt was claimed twice"
        types = [e["type"] for e in events]
        if "Succeeded" in types:  # succeeded is final: nothing (no resume) runs it again
            assert types.index("Succeeded") == len(types) - 1, types
