"""A seeded, concurrent workload through the real commands; then the log replays to the live tables.

Thousands of jobs and dozens of workflows go through retries, deaths, failure
handlers, trigger waits and timeouts, sleeps, cancels, manual retries, crashes
recovered as stale, late reports from superseded attempts and hand-backs, with
several claimer threads (each its own connection) and an operator thread
racing them, on a simulated clock. Along the way the test records the live
state at quiet moments and verifies while the commands run; at the end the
replay must equal the live projections and the as-of folds must equal the
recorded states.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable
from uuid import UUID

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from qforge.commands import tokens
from qforge.workflows import engine as wf
from qforge.commands.claim import ClaimedJob, claim
from qforge.commands.enqueue import JobSpec, enqueue
from qforge.commands.errors import Conflict, NotFound
from qforge.commands.manage import cancel_job, recover_stale, retry_job
from qforge.workflows.definitions import DefinitionSpec, store_definition
from qforge.workflows.engine import start_definition
from qforge.workflows.resume import resume
from qforge.commands.report import Report, complete, fail, heartbeat
from qforge.db import connect
from qforge.events.states import JOB_ACTIVE
from qforge.events.types import EVENT_TYPES, FLOW_EVENT_TYPES, parse_data
from qforge.projections import replay
from qforge.projections.asof import job_as_of, workflow_as_of
from qforge.projections.jobs import get_job
from qforge.projections.workflows import get_workflow
from tests.conftest import ORACLE_SQL

from qforge.commands.workers import release

SEED = 20_240_611
JOBS = 3_000
WORKFLOWS = 40
CLAIMERS = 4
STALE_SECONDS = 10.0
TICK = timedelta(seconds=3)
MAX_ROUNDS = 400
RECORD_ROUNDS = {3, 8, 15, 25, 40}
VERIFY_ROUNDS = {6, 20}
START = datetime(2031, 1, 1, tzinfo=timezone.utc)
QUEUES = ["default", "emails"]


class Clock:
    """The simulated time every command of a round is given."""

    def __init__(self, start: datetime):
        self.now = start

    def advance(self, by: timedelta) -> None:
        self.now += by


@dataclass
class Held:
    """A claimed job a worker keeps running across rounds (heartbeating), or has lost track of."""

    job: ClaimedJob
    rounds_left: int


@dataclass
class Claimer:
    """One worker: its own connection, random source and in-flight jobs."""

    name: str
    conn: psycopg.Connection
    rng: random.Random
    held: list[Held] = field(default_factory=list)
    zombies: list[ClaimedJob] = field(default_factory=list)  # crashed: never heartbeats again
    rejected: int = 0

    def round(self, clock: Clock) -> None:
        now = clock.now
        done: list[Report] = []
        failed: list[Report] = []
        handed_back: list[Report] = []
        still_held: list[Held] = []
        for held in self.held:
            if held.rounds_left > 0:
                held.rounds_left -= 1
                still_held.append(held)
            else:
                done.append(_report(held.job, result={"slow": True}))
        outcome = heartbeat(self.conn, [_report(h.job) for h in still_held], actor=self.name,
                            now=now)
        self.rejected += len(outcome.rejected)
        lost = set(outcome.rejected)  # cancelled or recovered meanwhile: the worker stops them
        self.held = [h for h in still_held if h.job.id not in lost]
        if self.zombies and self.rng.random() < 0.3:
            # A crashed worker comes back and reports with its old attempt: fenced.
            late = self.zombies.pop(self.rng.randrange(len(self.zombies)))
            result = complete(self.conn, [_report(late, result={"late": True})], actor=self.name,
                              now=now, workflow_ids_known=True)
            self.rejected += len(result.rejected)
        for job in claim(self.conn, QUEUES, self.rng.randint(5, 25), self.name, now=now):
            roll = self.rng.random()
            if roll < 0.03:
                self.zombies.append(job)
            elif roll < 0.05:
                handed_back.append(_report(job))
            elif job.task == "slow" or roll < 0.10:
                self.held.append(Held(job, self.rng.randint(1, 2)))
            elif job.task == "fail" or (job.task == "flaky" and self.rng.random() < 0.5):
                failed.append(_report(job, error=f"{job.task} attempt {job.attempt} broke"))
            elif job.task == "route":
                done.append(_report(job, result={"route": self.rng.choice(["b", "c"])}))
            else:
                done.append(_report(job, result={"ok": job.attempt, "step": job.step}))
        if handed_back:
            release(self.conn, handed_back, actor=self.name, now=now)
        for batch, command in ((done, complete), (failed, fail)):
            if batch:
                result = command(self.conn, batch, actor=self.name, now=now,
                                 workflow_ids_known=True)
                self.rejected += len(result.rejected)


def _report(job: ClaimedJob, *, result: Any = None, error: str | None = None) -> Report:
    return Report(job.id, job.attempt, result=result, error=error, workflow_id=job.workflow_id)


class Operator:
    """The humans and the monitor: cancels, manual retries, triggers, timers, stale recovery,
    API tokens made and revoked."""

    def __init__(self, conn: psycopg.Connection, rng: random.Random, job_ids: list[UUID]):
        self.conn, self.rng, self.job_ids = conn, rng, job_ids
        self.manual_retries = 0
        self.resumes = 0
        self.conflicts = 0

    def round(self, clock: Clock) -> None:
        now = clock.now
        self._tolerating(lambda: recover_stale(self.conn, stale_seconds=STALE_SECONDS, now=now))
        self._tolerating(lambda: wf.fire_timers(self.conn, now=now))
        for _ in range(self.rng.randint(0, 3)):
            job_id = self.rng.choice(self.job_ids)
            self._tolerating(lambda: cancel_job(self.conn, job_id, actor="operator", now=now))
        if self.rng.random() < 0.15 or clock.now - START in (TICK, 4 * TICK):
            with self.conn.cursor() as cur:
                cur.execute("SELECT id FROM workflows WHERE status = 'running'"
                            " ORDER BY random() LIMIT 1")
                running = cur.fetchone()
            if running:
                self._tolerating(lambda: wf.cancel(self.conn, running[0], actor="operator", now=now))
        if self.manual_retries < 80:
            for job_id in self._ids("SELECT id FROM jobs WHERE status = ANY(%s) AND workflow_id IS NULL"
                                    " ORDER BY random() LIMIT 3", ["dead", "cancelled"]):
                if self._tolerating(lambda: retry_job(self.conn, job_id, actor="operator", now=now)):
                    self.manual_retries += 1
        if self.resumes < 15 and self.rng.random() < 0.3:  # run a failed or cancelled workflow again
            for workflow_id in self._ids("SELECT id FROM workflows WHERE status = ANY(%s)"
                                         " ORDER BY random() LIMIT 1", ["failed", "cancelled"]):
                if self._tolerating(lambda: resume(self.conn, workflow_id, actor="operator", now=now)):
                    self.resumes += 1
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT workflow_id, step FROM jobs WHERE status = 'waiting'"
                        " AND step_type = 'wait_for_trigger'")
            waiting = cur.fetchall()
        for row in waiting:
            if self.rng.random() < 0.3:  # the rest wait until their timeout fires
                self._tolerating(lambda: wf.trigger(self.conn, row["workflow_id"], row["step"],
                                                    {"approved_by": "operator"}, now=now))
        if self.rng.random() < 0.3:  # tokens come and go (a name again after its revocation)
            name = self.rng.choice(["ops-a", "ops-b", "ops-c"])
            if self.rng.random() < 0.5:
                self._tolerating(lambda: tokens.create_token(
                    self.conn, name, self.rng.choice(tokens.SCOPES), actor="operator"))
            else:
                self._tolerating(lambda: tokens.revoke_token(self.conn, name, actor="operator"))

    def _ids(self, query: str, statuses: list[str]) -> list[UUID]:
        with self.conn.cursor() as cur:
            cur.execute(query, (statuses,))
            return [row[0] for row in cur.fetchall()]

    def _tolerating(self, command: Callable[[], Any]) -> bool:
        """Run a command that a racing worker may have made pointless (409)."""
        try:
            command()
            return True
        except (Conflict, NotFound):
            self.conflicts += 1
            return False


def _job_specs(rng: random.Random) -> list[JobSpec]:
    specs = []
    for n in range(JOBS):
        fields: dict[str, Any] = {
            "task": rng.choices(["ok", "flaky", "fail", "slow"], weights=[6, 3, 1, 1])[0],
            "queue": rng.choice(QUEUES), "priority": rng.randint(-1, 2),
            "max_retries": rng.randint(0, 3), "payload": {"n": n},
        }
        if rng.random() < 0.3:
            fields["tags"] = {"tenant": f"t{n % 5}", "batch": str(n // 500)}
        if rng.random() < 0.1:
            fields["delay_seconds"] = rng.uniform(0, 30)
        if rng.random() < 0.05:
            fields["idempotency_key"] = f"key-{rng.randint(0, 40)}"  # some repeat
        specs.append(JobSpec(**fields))
    return specs


def _workflow_spec(rng: random.Random, n: int) -> wf.WorkflowSpec:
    shape = n % 6
    if shape == 0:  # a chain with a flaky middle
        steps = [{"step": "a", "task": "ok"},
                 {"step": "b", "task": "flaky", "depends_on": ["a"], "max_retries": 2},
                 {"step": "c", "task": "ok", "depends_on": ["b"]}]
    elif shape == 1:  # branches on a step's output
        steps = [{"step": "r", "task": "route"},
                 {"step": "b", "task": "ok", "when": {"step": "r", "path": "route", "equals": "b"}},
                 {"step": "c", "task": "ok", "when": {"step": "r", "path": "route", "in": ["c"]}},
                 {"step": "after_b", "task": "ok", "depends_on": ["b"]}]
    elif shape == 2:  # a failure handler (which itself may fail)
        steps = [{"step": "a", "task": "fail", "max_retries": rng.randint(0, 1), "on_failure": "h"},
                 {"step": "h", "task": rng.choice(["ok", "ok", "fail"]), "max_retries": 0},
                 {"step": "after", "task": "ok", "depends_on": ["a"]}]
    elif shape == 3:  # a trigger wait: pressed by the operator or timing out
        steps = [{"step": "a", "task": "ok"},
                 {"step": "approve", "type": "wait_for_trigger", "depends_on": ["a"],
                  "timeout_seconds": rng.choice([15, 40])},
                 {"step": "b", "task": "ok", "depends_on": ["approve"]}]
    elif shape == 4:  # a timer
        steps = [{"step": "a", "task": "ok"},
                 {"step": "nap", "type": "sleep", "seconds": rng.choice([5, 20]), "depends_on": ["a"]},
                 {"step": "b", "task": "slow", "depends_on": ["nap"]}]
    else:  # fan out and in
        steps = [{"step": "a", "task": "ok"}]
        steps += [{"step": f"p{i}", "task": rng.choice(["ok", "flaky"]), "depends_on": ["a"],
                   "queue": rng.choice(QUEUES)} for i in range(4)]
        steps += [{"step": "join", "task": "ok", "depends_on": [f"p{i}" for i in range(4)]}]
    tags = {"workflow_shape": str(shape)} if n % 2 else {}
    return wf.WorkflowSpec.model_validate({"name": f"w{n}", "steps": steps, "tags": tags})


@dataclass
class Recorded:
    """The live state at a quiet moment (no transaction in flight) and the log position then."""

    position: int
    job_status: dict[UUID, str]
    workflow_status: dict[UUID, str]
    job_views: dict[UUID, dict]
    workflow_views: dict[UUID, dict]


def _record(conn, rng: random.Random, job_ids: list[UUID], workflow_ids: list[UUID]) -> Recorded:
    with conn.cursor() as cur:
        cur.execute("SELECT coalesce(max(position), 0) FROM events")
        position = cur.fetchone()[0]
        cur.execute("SELECT id, status FROM jobs")
        jobs = dict(cur.fetchall())
        cur.execute("SELECT id, status FROM workflows")
        workflows = dict(cur.fetchall())
    sample_jobs = rng.sample(job_ids, 40)
    sample_workflows = rng.sample(workflow_ids, 8)
    return Recorded(position, jobs, workflows,
                    {job_id: get_job(conn, job_id) for job_id in sample_jobs},
                    {wid: get_workflow(conn, wid) for wid in sample_workflows})


def _run_together(tasks: list[Callable[[], Any]]) -> list[Any]:
    """Start every task on its own thread at once (a barrier); re-raise the first failure."""
    barrier = threading.Barrier(len(tasks))
    results: list[Any] = [None] * len(tasks)
    errors: list[BaseException] = []

    def run(index: int, task: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = task()
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate(tasks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if errors:
        raise errors[0]
    return results


def _active_jobs(conn) -> int:
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM jobs WHERE status = ANY(%s)", (sorted(JOB_ACTIVE),))
        return cur.fetchone()[0]


def _event_counts(conn) -> dict[str, int]:
    with conn.cursor() as cur:
        cur.execute("SELECT type, count(*) FROM events GROUP BY type")
        counts = dict(cur.fetchall())
        cur.execute("SELECT count(*) FROM events WHERE type = 'Retried' AND data ? 'manual'")
        counts["manual Retried"] = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM events WHERE type = 'Failed'"
                    " AND data ->> 'reason' = 'heartbeat_timeout'")
        counts["heartbeat_timeout Failed"] = cur.fetchone()[0]
    return counts


@pytest.fixture
def backoff(monkeypatch):
    monkeypatch.setenv("QFORGE_BACKOFF_BASE_SECONDS", "1")
    monkeypatch.setenv("QFORGE_BACKOFF_CAP_SECONDS", "8")


def test_randomized_workload_replays_to_exactly_the_live_projections(db_url, backoff):
    rng = random.Random(SEED)
    clock = Clock(START)
    connections = [connect(db_url, autocommit=True) for _ in range(CLAIMERS + 3)]
    try:
        main, operator_conn, verifier_conn, *claimer_conns = connections
        job_ids = []
        specs = _job_specs(rng)
        for start in range(0, len(specs), 250):
            job_ids += [e.id for e in enqueue(main, specs[start:start + 250], now=clock.now)]
        workflow_ids = [wf.submit(main, _workflow_spec(rng, n), now=clock.now)[0]
                        for n in range(WORKFLOWS)]
        for version in range(2):  # a stored definition, two versions, and a run of it
            store_definition(main, "nightly", DefinitionSpec.model_validate(
                {"retry_policy": {"max_retries": version}, "steps": [{"step": "a", "task": "ok"}]}), now=clock.now)
        workflow_ids.append(start_definition(main, "nightly", {"n": 1}, actor="scheduler", now=clock.now))
        with main.cursor() as cur:
            cur.execute("SELECT id FROM jobs WHERE workflow_id IS NOT NULL")
            step_ids = [row[0] for row in cur.fetchall()]
        claimers = [Claimer(f"claimer-{i}", c, random.Random(SEED + i + 1))
                    for i, c in enumerate(claimer_conns)]
        operator = Operator(operator_conn, random.Random(SEED - 1), sorted(set(job_ids)) + step_ids)

        recorded: list[Recorded] = []
        verified_while_running = []
        for round_number in range(1, MAX_ROUNDS + 1):
            tasks: list[Callable[[], Any]] = [lambda c=c: c.round(clock) for c in claimers]
            tasks.append(lambda: operator.round(clock))
            if round_number in VERIFY_ROUNDS:
                tasks.append(lambda: replay.verify(verifier_conn, chunk_positions=2_000))
            results = _run_together(tasks)
            if round_number in VERIFY_ROUNDS:
                verified_while_running.append(results[-1])
            if round_number in RECORD_ROUNDS:
                recorded.append(_record(main, rng, sorted(set(job_ids)) + step_ids, workflow_ids))
            clock.advance(TICK)
            if round_number > max(RECORD_ROUNDS) and _active_jobs(main) == 0:
                break
        assert _active_jobs(main) == 0, "the workload did not settle"

        # What the run went through (so a quiet run cannot pass for a thorough one).
        counts = _event_counts(main)
        for kind in ("Retried", "DeadLettered", "Cancelled", "Skipped", "Triggered", "Heartbeat",
                     "StepUnblocked", "WorkflowSucceeded", "WorkflowFailed", "WorkflowCancelled",
                     "manual Retried", "heartbeat_timeout Failed"):
            assert counts.get(kind, 0) > 0, f"the workload produced no {kind} event: {counts}"
        assert counts.get("Released", 0) > 0
        assert sum(c.rejected for c in claimers) > 0  # late reports were fenced off
        assert sum(counts.values()) > 3 * JOBS

        # Every stored event has the shape its type's model says (after upcasting).
        with main.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT type, schema_version, data FROM events ORDER BY position")
            stored = cur.fetchall()
        for row in stored:
            parse_data(row["type"], row["schema_version"], row["data"])
        # (flow control's schedule and queue streams have tests of their own)
        assert {row["type"] for row in stored} == EVENT_TYPES - FLOW_EVENT_TYPES

        assert verified_while_running == [[], []]
        assert replay.verify(main, chunk_positions=5_000) == []
        # ... and every row is what the row-by-row oracle folds from its stream.
        main.execute(sql.SQL(ORACLE_SQL.read_text()))  # type: ignore[arg-type]
        with main.cursor() as cur:
            for table, fold in (("jobs", "oracle_job_fold"), ("workflows", "oracle_workflow_fold")):
                cur.execute(sql.SQL(
                    "SELECT count(*), count(*) FILTER (WHERE to_jsonb(l) <> to_jsonb(f.folded)) FROM {} l,"
                    " LATERAL (SELECT {}(e ORDER BY e.version) AS folded FROM events e"
                    "          WHERE e.stream_id = l.id) f").format(sql.Identifier(table), sql.Identifier(fold)))
                rows, unlike = cur.fetchone()
                assert rows > 0 and unlike == 0, (table, unlike)
        built = replay.rebuild(main, chunk_positions=5_000, url=db_url, parallel=2)
        assert built.folders == 2
        with main.cursor() as cur:
            for table in ("jobs", "workflows", "execution_tags", "tokens"):
                cur.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
                assert built.rows[table] == cur.fetchone()[0], table
        swapped = replay.swap(main)
        assert swapped.changed == 0 and swapped.marked == 0

        # The past, folded from the log, is what the live tables showed then.
        assert [r.position for r in recorded] == sorted(r.position for r in recorded)
        for moment in recorded:
            replay.rebuild(main, replay.SCRATCH_SCHEMA, moment.position, chunk_positions=5_000)
            with main.cursor() as cur:
                cur.execute("SELECT id, status FROM qforge_replay.jobs")
                assert dict(cur.fetchall()) == moment.job_status
                cur.execute("SELECT id, status FROM qforge_replay.workflows")
                assert dict(cur.fetchall()) == moment.workflow_status
            for job_id, view in moment.job_views.items():
                assert job_as_of(main, job_id, moment.position) == view
            for workflow_id, view in moment.workflow_views.items():
                assert workflow_as_of(main, workflow_id, moment.position) == view
        assert len({r.position for r in recorded}) == len(RECORD_ROUNDS)
    finally:
        for connection in connections:
            connection.close()
