"""Property: a random workflow program, run durably with crashes at random points, ends as a plain
in-memory run of the same program does, and no step whose result was recorded runs again.

Programs mix sequences, branches, loops, parallel groups, waits, sleeps and caught failures. The
durable run goes through the real commands on a real database (claim, the activation replaying
the function, complete, the monitor's recovery, timers, triggers) on a logical clock. A crash is
what a SIGKILL leaves in the database: a claimed job (a step, or a run of the function) whose
worker never reports; the monitor's recovery then fails that attempt and it runs again. The
real-process kills are in tests/test_code_workflows.py; this explores many more interleavings.
"""

from __future__ import annotations

import asyncio
import random
from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

import qforge
from qforge.commands import report
from qforge.commands.claim import claim
from qforge.commands.manage import recover_stale
from qforge.commands.plan import run
from qforge.workflows import activation, durable, engine
from qforge.workflows.replay import StepFailed

OPS = st.one_of(
    st.tuples(st.just("run"), st.integers(0, 9)),
    st.tuples(st.just("fail"), st.integers(0, 9)),
    st.tuples(st.just("par"), st.integers(1, 4)),
    st.tuples(st.just("branch"), st.integers(0, 9)),
    st.tuples(st.just("loop"), st.integers(0, 3)),
    st.tuples(st.just("wait"), st.integers(0, 9)),
    st.tuples(st.just("sleep"), st.integers(0, 9)),
    st.tuples(st.just("now"), st.integers(0, 9)),
)


def interpret(ctx, program):
    """The workflow: the same code runs durably (ctx) and in memory (Plain)."""
    trace = []
    for index, (kind, value) in enumerate(program):
        if kind == "run":
            trace.append(ctx.run("echo", {"v": value}))
        elif kind == "fail":
            try:
                ctx.run("fail", {"message": f"no {value}"}, max_retries=0)
            except StepFailed as failure:
                trace.append(["caught", failure.error])
        elif kind == "par":
            trace.append(ctx.gather(*[ctx.start("add", {"a": value, "b": j}) for j in range(value)]))
        elif kind == "branch":
            total = ctx.run("add", {"a": value, "b": 1})
            trace.append(ctx.run("echo", {"odd": total}) if total % 2 else ["even", total])
        elif kind == "loop":
            trace.append([ctx.run("add", {"a": j, "b": j}) for j in range(value)])
        elif kind == "wait":
            trace.append(ctx.wait(f"w{index}"))
        elif kind == "sleep":
            ctx.sleep(0)
            trace.append("slept")
        else:
            trace.append(ctx.now().year > 2000)
    return trace


qforge.workflow("prop_program")(interpret)


class Plain:
    """The in-memory run: every call does its work at once."""

    def __init__(self):
        self.waits = 0

    def run(self, task, payload=None, **options):
        return TASKS[task](payload or {})

    def start(self, task, payload=None, **options):
        try:
            return ("ok", TASKS[task](payload or {}))
        except StepFailed as failure:
            return ("failed", failure)

    def gather(self, *handles):
        for kind, value in handles:
            if kind == "failed":
                raise value
        return [value for _, value in handles]

    def wait(self, step, timeout=None):
        return {"trigger": step}

    def sleep(self, seconds):
        pass

    def now(self):
        return datetime.now(timezone.utc)


def _fail(payload):
    raise StepFailed("x", payload["message"], 1)


TASKS = {"echo": lambda p: p, "add": lambda p: p["a"] + p["b"], "fail": _fail}


def run_durably(conn, program, crashes: random.Random) -> tuple[dict, dict]:
    """Drive the workflow to its end; (workflow row, {job id: [attempts that ran to completion]})."""
    clock = datetime(2030, 1, 1, tzinfo=timezone.utc)
    workflow_id, _ = run(conn, durable.start_plan(durable.CodeWorkflowSpec(code="prop_program", input=program),
                                                  actor="test", now=clock))
    completed: dict = {}
    for _ in range(400):
        clock += timedelta(hours=1)
        jobs = claim(conn, ["default"], 20, "prop", now=clock)
        for job in jobs:
            # (not a step without retries: its one attempt lost to a crash rightly fails it)
            if job.attempt == 1 and job.task != "fail" and crashes.random() < 0.3:
                continue  # killed inside it: no report; the monitor recovers it below
            if job.task == "qforge.workflow":
                result = asyncio.run(activation.activate(*durable.read_history(conn, job.workflow_id)))
                report.complete(conn, [report.Report(job.id, job.attempt, result=result)], actor="prop", now=clock)
            else:
                completed.setdefault(job.id, []).append(job.attempt)
                try:
                    result = TASKS[job.task](job.payload)
                except StepFailed as failure:
                    report.fail(conn, [report.Report(job.id, job.attempt, error=failure.error)], actor="prop",
                                now=clock)
                else:
                    report.complete(conn, [report.Report(job.id, job.attempt, result=result)], actor="prop",
                                    now=clock)
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT step FROM jobs WHERE workflow_id = %s AND step_type = 'wait_for_trigger'"
                        " AND status = 'waiting'", (workflow_id,))
            for row in cur.fetchall():
                engine.trigger(conn, workflow_id, row["step"], {"trigger": row["step"]}, now=clock)
        engine.fire_timers(conn, now=clock)
        recover_stale(conn, stale_seconds=60, now=clock + timedelta(minutes=30))
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT * FROM workflows WHERE id = %s", (workflow_id,))
            row = cur.fetchone()
        if row["status"] != "running":
            return row, completed
    raise AssertionError(f"program {program} did not finish")


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=st.lists(OPS, min_size=1, max_size=6), seed=st.integers(0, 2**32))
def test_random_programs_with_crashes_end_as_the_plain_run(conn, program, seed):
    expected = interpret(Plain(), program)
    row, completed = run_durably(conn, program, random.Random(seed))
    assert row["status"] == "succeeded", row["error"]
    assert row["result"] == expected
    # a step ran to completion once: never again after its result was recorded
    assert all(len(attempts) == 1 for attempts in completed.values()), completed
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM events WHERE workflow_id = %s AND type = 'Succeeded'"
                    " GROUP BY stream_id HAVING count(*) > 1", (row["id"],))
        assert cur.fetchall() == []
