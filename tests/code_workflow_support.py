"""Helpers for the code workflow tests: a task module with @qforge.workflow functions and their steps.

The steps write one line per run to the file QF_RUNS_FILE names ("step attempt"),
so a test can prove which steps ran, how often, and that none ran after its
result was recorded. Markers in QF_MARK_DIR let a test kill a worker at a chosen
point: `<name>.here` appears when the point is reached, the code then waits.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from psycopg.rows import tuple_row

CODE_TASKS = textwrap.dedent('''
    """Steps and code workflows for tests/test_code_workflows*.py."""
    import os
    import time
    from pathlib import Path

    import qforge
    from qforge.workers.tasks import TaskError


    def _runs(line):
        with open(os.environ["QF_RUNS_FILE"], "a") as out:
            out.write(line + "\\n")


    def hold(name):
        """Once per name: leave a marker and wait for the test to kill this process."""
        marks = Path(os.environ["QF_MARK_DIR"])
        if (marks / (name + ".here")).exists():
            return
        (marks / (name + ".here")).write_text(str(os.getpid()))
        time.sleep(60)


    @qforge.task("cw_step")
    def cw_step(payload, ctx):
        _runs(f"{ctx.step} {ctx.attempt}")
        if payload.get("hold"):
            hold(payload["hold"])
        if payload.get("fail") or (payload.get("fail_unless") and not Path(payload["fail_unless"]).exists()):
            raise TaskError(f"step {ctx.step} fails")
        return {"n": payload.get("n"), "step": ctx.step}


    @qforge.workflow("cw_crashy")
    def crashy(ctx, inp):
        a = ctx.run("cw_step", {"n": 1, "hold": "in-step"})
        stamp, ident, luck = ctx.now(), ctx.uuid(), ctx.random()
        b = ctx.run("cw_step", {"n": 2})
        if not ctx.is_replaying():
            hold("in-function")
        c, d = ctx.gather(ctx.start("cw_step", {"n": 3}), ctx.start("cw_step", {"n": 4}, step="fourth"))
        ctx.sleep(0.3)
        return {"a": a, "b": b, "c": c, "d": d, "now": stamp.isoformat(), "uuid": str(ident), "random": luck}


    @qforge.workflow("cw_catches")
    def catches(ctx, inp):
        try:
            ctx.run("cw_step", {"fail": True}, max_retries=1, step="doomed")
        except qforge.StepFailed as failure:
            return {"caught": failure.error, "attempts": failure.attempts, "step": failure.step}
        return {"caught": None}


    @qforge.workflow("cw_uncaught")
    def uncaught(ctx, inp):
        ctx.run("cw_step", {"fail": True}, max_retries=0)
        return "never"


    @qforge.workflow("cw_waits")
    def waits(ctx, inp):
        answer = ctx.wait("approve")
        return {"answer": answer, "after": ctx.run("cw_step", {"n": inp})}


    @qforge.workflow("cw_variant")
    def variant(ctx, inp):
        if os.environ.get("QF_VARIANT") == "2":  # the code as redeployed: another first step
            ctx.run("echo", {"changed": True}, step="refund")
        else:
            ctx.run("cw_step", {"n": 1}, step="ship")
        return ctx.wait("go")


    @qforge.workflow("cw_fixable")
    def fixable(ctx, inp):
        first = ctx.run("cw_step", {"n": 1}, step="first")
        # a reopened step runs with the payload the log holds: the fix is in the world, not the input
        second = ctx.run("cw_step", {"n": 2, "fail_unless": inp["fixed"]}, step="second", max_retries=0)
        return {"first": first, "second": second}


    @qforge.workflow("cw_long")
    def long(ctx, inp):
        ctx.run("slow", {"seconds": 60}, step="long")
        return ctx.run("cw_step", {"n": 2}, step="never")


    @qforge.workflow("cw_kid")
    def kid(ctx, inp):
        return ctx.run("add", {"a": inp["x"], "b": 3})


    @qforge.workflow("cw_parent")
    def parent(ctx, inp):
        code_child = ctx.child("cw_kid", {"x": 2})
        stored_child = ctx.child("kid_def", {"v": 1})
        try:
            ctx.child("cw_uncaught")
        except qforge.StepFailed as failure:
            failed = failure.error
        return {"code": code_child, "stored": stored_child, "failed": failed}


    @qforge.workflow("cw_parent_waits")
    def parent_waits(ctx, inp):
        return ctx.child("cw_waits", 1)


    @qforge.workflow("cw_versioned")
    def versioned(ctx, inp):
        new = ctx.version("audit-first") if os.environ.get("QF_VARIANT") == "2" else False
        if new:
            ctx.run("echo", {"audit": True}, step="audit")
        ctx.run("cw_step", {"n": 1}, step="one")
        ctx.wait("go")
        return {"new": new}


    @qforge.workflow("cw_many")
    def many(ctx, inp):
        return ctx.gather(*[ctx.start("echo", {"i": i}) for i in range(inp["n"])])


    @qforge.workflow("cw_async")
    async def in_async(ctx, inp):
        first = await ctx.run("add", {"a": inp["a"], "b": 1})
        both = await ctx.gather(ctx.start("add", {"a": first, "b": 1}), ctx.start("echo", {"x": first}))
        await ctx.sleep(0.2)
        return {"first": first, "both": both, "random": ctx.random()}
''')


def runs(path: Path) -> list[tuple[str, int]]:
    """Every step run the tasks recorded: (step, attempt), in order."""
    if not path.exists():
        return []
    return [(line.rsplit(" ", 1)[0], int(line.rsplit(" ", 1)[1])) for line in path.read_text().splitlines()]


@pytest.fixture
def code_env(tasks_dir: Path, tmp_path: Path) -> dict[str, Any]:
    """The task module beside the worker tests' one, and the files its steps write."""
    (tasks_dir / "qf_code_tasks.py").write_text(CODE_TASKS)
    marks = tmp_path / "marks"
    marks.mkdir()
    return {"env": {"QF_RUNS_FILE": str(tmp_path / "runs.txt"), "QF_MARK_DIR": str(marks)},
            "runs": tmp_path / "runs.txt", "marks": marks}


def journal_values(conn, workflow_id) -> list[Any]:
    """The now/uuid/random values the log recorded, in order."""
    rows = conn.cursor(row_factory=tuple_row).execute("SELECT result FROM jobs WHERE workflow_id = %s AND step_type = 'code'"
                        " AND status = 'succeeded' ORDER BY (payload ->> 'n')::int", (workflow_id,)).fetchall()
    return [op["value"] for (result,) in rows for op in result.get("ops", []) if op.get("op") == "value"]


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
