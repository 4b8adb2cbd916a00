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
import os
import random
import textwrap
import time
from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pathlib import Path

from psycopg.rows import dict_row, tuple_row

import qforge
from qforge.commands import report
from qforge.commands.claim import claim
from qforge.commands.manage import recover_stale
from qforge.commands.plan import run
from qforge.workflows import activation, durable, engine
from qforge.workflows.replay import StepFailed
from cluster_procs import start_api
from test_worker_support import kill, procs, tasks_dir, wait_for  # noqa: F401  (procs, tasks_dir: fixtures)

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
    return run_program(ctx, program)


def run_program(ctx, program, prefix="", fail_retries=0):
    """`prefix`: the tasks' names are prefix + echo, add, fail (the real workers' record their runs)."""
    trace = []
    for index, (kind, value) in enumerate(program):
        if kind == "run":
            trace.append(ctx.run(prefix + "echo", {"v": value}))
        elif kind == "fail":
            try:
                ctx.run(prefix + "fail", {"message": f"no {value}"}, max_retries=fail_retries)
            except StepFailed as failure:
                trace.append(["caught", failure.error])
        elif kind == "par":
            trace.append(ctx.gather(*[ctx.start(prefix + "add", {"a": value, "b": j}) for j in range(value)]))
        elif kind == "branch":
            total = ctx.run(prefix + "add", {"a": value, "b": 1})
            trace.append(ctx.run(prefix + "echo", {"odd": total}) if total % 2 else ["even", total])
        elif kind == "loop":
            trace.append([ctx.run(prefix + "add", {"a": j, "b": j}) for j in range(value)])
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
        return TASKS[task.removeprefix(REAL_PREFIX)](payload or {})

    def start(self, task, payload=None, **options):
        try:
            return ("ok", TASKS[task.removeprefix(REAL_PREFIX)](payload or {}))
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


# --- the same with real processes: workers killed with SIGKILL at random moments -------------

REAL_PREFIX = "prop_"
REAL_TASKS = textwrap.dedent('''
    """The property's program run by real workers: its steps record each run ("job attempt")."""
    import os
    import random
    import sys
    import time

    import qforge
    from qforge.workers.tasks import TaskError

    sys.path.insert(0, os.environ["QF_TESTS_DIR"])
    from test_code_workflow_properties import run_program  # noqa: E402


    def _ran(ctx):
        with open(os.environ["QF_RUNS_FILE"], "a") as out:
            out.write(f"{ctx.job_id} {ctx.attempt}\\n")
        time.sleep(random.uniform(0.05, 0.3))  # long enough to be killed inside now and then


    @qforge.task("prop_echo")
    def echo(payload, ctx):
        _ran(ctx)
        return payload


    @qforge.task("prop_add")
    def add(payload, ctx):
        _ran(ctx)
        return payload["a"] + payload["b"]


    @qforge.task("prop_fail")
    def fail(payload, ctx):
        _ran(ctx)
        raise TaskError(payload["message"])


    @qforge.workflow("prop_real")
    def prop_real(ctx, program):
        # a killed attempt of a failing step is retried: its last attempt fails as the plain run does
        return run_program(ctx, program, prefix="prop_", fail_retries=3)
''')
REAL_PROGRAMS, REAL_KILLS = 8, 4


def test_random_programs_with_workers_killed_9_end_as_the_plain_run(conn, procs, tasks_dir, tmp_path):
    """Random programs run by `qforge worker` processes that are SIGKILLed at random moments (inside
    steps, inside the function, inside the report's transaction, between steps), then served to the
    end by one more: each ends as its plain in-memory run, and no step ran again once its result
    was in the log."""
    (tasks_dir / "qf_prop_tasks.py").write_text(REAL_TASKS)
    env = {"QF_RUNS_FILE": str(tmp_path / "runs.txt"), "QF_TESTS_DIR": str(Path(__file__).parent)}
    _, base = start_api(procs, env)
    procs.monitor(env)  # recovers the killed workers' jobs, fires the sleeps' timers
    chance = random.Random(int(os.environ.get("QF_PROP_SEED", "32")))
    programs = [[chance.choice(REAL_OPS)(chance) for _ in range(chance.randint(2, 7))] for _ in range(REAL_PROGRAMS)]
    with qforge.Client(base) as client:
        ids = [client.start("prop_real", program).id for program in programs]
        for _ in range(REAL_KILLS):
            worker = procs.worker("--tasks", "qf_prop_tasks", "--concurrency", "2", env=env)
            wait_for(lambda: "started" in worker.log(), timeout=30, message="the worker to start")
            _trigger_waits(conn, client, ids, until=time.monotonic() + chance.uniform(0.05, 1.2))
            kill(worker)
        procs.worker("--tasks", "qf_prop_tasks", "--concurrency", "2", env=env)
        deadline = time.monotonic() + 90
        while _running(conn, ids) and time.monotonic() < deadline:
            _trigger_waits(conn, client, ids, until=time.monotonic() + 0.5)
    for workflow_id, program in zip(ids, programs):
        [row] = _rows(conn, "SELECT status, result, error FROM workflows WHERE id = %s", workflow_id)
        assert row[0] == "succeeded", (program, row)
        assert row[1] == run_program(Plain(), program, prefix=REAL_PREFIX, fail_retries=3), program
    ran: dict[str, list[int]] = {}
    for line in (tmp_path / "runs.txt").read_text().splitlines():
        job_id, attempt = line.split()
        ran.setdefault(job_id, []).append(int(attempt))
    succeeded = dict(_rows(
        conn, "SELECT stream_id::text, (data ->> 'attempt')::int FROM events WHERE workflow_id = ANY(%s) AND type ="
        " 'Succeeded' AND stream_id IN (SELECT id FROM jobs WHERE step_type = 'task')", ids))
    assert succeeded and set(succeeded) <= set(ran)
    # a step runs again only when no result of it was recorded: never after its Succeeded
    assert all(max(ran[job_id]) == attempt for job_id, attempt in succeeded.items()), (succeeded, ran)
    assert _rows(conn, "SELECT count(*) FROM events WHERE workflow_id = ANY(%s) AND type = 'Succeeded'"
                       " GROUP BY stream_id HAVING count(*) > 1", ids) == []
    # the kills did land on work in progress: the monitor recovered attempts of killed workers
    assert _rows(conn, "SELECT count(*) FROM events WHERE workflow_id = ANY(%s) AND type = 'Failed'"
                       " AND data ->> 'reason' = 'heartbeat_timeout'", ids)[0][0] > 0


REAL_OPS = [
    lambda r: ("run", r.randint(0, 9)),
    lambda r: ("fail", r.randint(0, 9)),
    lambda r: ("par", r.randint(1, 4)),
    lambda r: ("branch", r.randint(0, 9)),
    lambda r: ("loop", r.randint(0, 3)),
    lambda r: ("wait", r.randint(0, 9)),
    lambda r: ("sleep", 0),
    lambda r: ("now", 0),
]


def _running(conn, ids) -> bool:
    return _rows(conn, "SELECT count(*) FROM workflows WHERE id = ANY(%s) AND status = 'running'", ids)[0][0] > 0


def _rows(conn, query: str, *args) -> list[tuple]:
    return conn.cursor(row_factory=tuple_row).execute(query, args).fetchall()


def _trigger_waits(conn, client: qforge.Client, ids, *, until: float) -> None:
    """Until `until`, answer every trigger wait of these workflows as the plain run does."""
    while time.monotonic() < until:
        for workflow_id, step in _rows(
                conn, "SELECT workflow_id, step FROM jobs WHERE workflow_id = ANY(%s) AND step_type = 'wait_for_trigger'"
                " AND status = 'waiting'", ids):
            try:
                client.trigger(workflow_id, step, {"trigger": step})
            except qforge.ApiError:
                pass  # answered meanwhile
        time.sleep(0.1)
