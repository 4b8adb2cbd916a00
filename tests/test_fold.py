"""The set-based fold equals the row-by-row oracle, live and in replay, for any legal sequence of events.

Streams follow random walks through the state machine; their events are
appended in random statements (several events of one stream in one statement,
several streams in one statement, streams interleaved), through the real
append path. Then the live rows, the oracle's fold of each stream
(tests/oracle_fold.sql) and a replay of the log must be the same rows.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from uuid import UUID

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from qforge.events import states, store
from qforge.events import types as ev
from qforge.events.ids import new_id
from qforge.events.types import NewEvent
from qforge.projections import replay

T0 = datetime(2031, 1, 1, tzinfo=timezone.utc)


class JobWalk:
    """A job stream's random walk through the state machine, one legal event at a time."""

    def __init__(self, rng: random.Random, stream_id: UUID, workflow_id: UUID | None):
        self.rng, self.stream_id, self.workflow_id = rng, stream_id, workflow_id
        self.status: str | None = None
        self.attempts = 0
        self.events: list[NewEvent] = []

    def step(self) -> bool:
        """Append one more event to the walk; False when the stream has nowhere to go."""
        rng, at = self.rng, T0 + timedelta(seconds=len(self.events))
        choices: list[ev.EventData] = []
        if self.status is None:
            status = rng.choice([states.PENDING, states.BLOCKED, states.WAITING])
            choices.append(ev.Enqueued(task=rng.choice(["echo", "add"]), status=status,
                                       queue=rng.choice(["default", "q2"]), priority=rng.randint(-2, 2),
                                       max_retries=rng.randint(0, 3), payload={"n": rng.randint(0, 9)},
                                       run_at=rng.choice([None, at]), step=rng.choice([None, "s1"]),
                                       depends_on=rng.choice([None, ["a"]]),
                                       element_of=rng.choice([None, "s1"]), element_index=rng.randint(0, 9)))
        else:
            for (source, event_type), target in states.JOB_TRANSITIONS.items():
                if source != self.status:
                    continue
                choices += self._data(event_type, target, at)
        if not choices:
            return False
        data = rng.choice(choices)
        wanted = getattr(data, "status", None)
        self.status = states.next_status("job", self.status, data.type, wanted)
        if data.type == ev.Claimed.type:
            self.attempts += 1
        self.events.append(NewEvent(stream_id=self.stream_id, version=len(self.events) + 1, data=data,
                                    tags={"walk": "yes"} if not self.events else {},
                                    workflow_id=self.workflow_id, actor=rng.choice(["w1", "w2", "api"])))
        return True

    def _data(self, event_type: str, target, at: datetime) -> list[ev.EventData]:
        rng, attempt = self.rng, self.attempts
        if event_type == "StepUnblocked":
            return [ev.StepUnblocked(status=s, run_at=rng.choice([None, at]), inputs={"a": rng.randint(0, 3)},
                                     failed_step=rng.choice([None, "x"]), error=rng.choice([None, "boom"]))
                    for s in sorted(target)]
        simple = {
            "Skipped": lambda: ev.Skipped(reason="condition not met"),
            "Claimed": lambda: ev.Claimed(attempt=attempt + 1, worker=rng.choice([None, "wx"])),
            "Heartbeat": lambda: ev.Heartbeat(attempt=attempt),
            "Succeeded": lambda: ev.Succeeded(attempt=attempt or None, result=rng.choice([None, {"r": 1}, [1]])),
            "Failed": lambda: ev.Failed(attempt=attempt, reason=rng.choice(["error", "timeout"]), error="e",
                                        result=rng.choice([None, {"partial": True}])),
            "Retried": lambda: ev.Retried(attempt=attempt, delay_seconds=1.5, run_at=at + timedelta(seconds=2),
                                          manual=self.status in (states.DEAD, states.CANCELLED)),
            "DeadLettered": lambda: ev.DeadLettered(attempt=attempt, error=rng.choice([None, "boom"])),
            "Released": lambda: ev.Released(attempt=attempt, reason="shutdown"),
            "Cancelled": lambda: ev.Cancelled(reason="cancelled by test"),
            "Triggered": lambda: ev.Triggered(payload={"ok": True}),
        }
        if event_type == "StepReopened":
            return [ev.StepReopened(status=s, run_at=rng.choice([None, at]), reason="resume")
                    for s in sorted(target)]
        return [simple[event_type]()]


def _workflow_events(rng: random.Random, workflow_id: UUID) -> list[NewEvent]:
    first = NewEvent(stream_id=workflow_id, version=1, tags={"wf": "yes"}, workflow_id=workflow_id,
                     data=ev.WorkflowSubmitted(name="walk", steps=[{"step": "s1", "task": "echo"}],
                                              result=rng.choice([None, {"step": "s1"}]),
                                              deadline_seconds=5, deadline_at=T0,
                                              definition=rng.choice([None, {"name": "d", "version": 2}]),
                                              parent=rng.choice([None, {"workflow_id": str(workflow_id),
                                                                        "job_id": str(workflow_id),
                                                                        "step": "s", "depth": 1}])))
    events = [first]
    ends = [None, ev.WorkflowSucceeded(result=rng.choice([None, {"r": 1}])), ev.WorkflowFailed(error="e"),
            ev.WorkflowFailed(error="deadline: late", reason="deadline"), ev.WorkflowCancelled()]
    while (end := rng.choice(ends)) is not None:  # a failed or cancelled one may be resumed
        events.append(NewEvent(stream_id=workflow_id, version=len(events) + 1, data=end,
                               workflow_id=workflow_id))
        if end.type == ev.WorkflowSucceeded.type or rng.random() < 0.5:
            break
        events.append(NewEvent(stream_id=workflow_id, version=len(events) + 1, workflow_id=workflow_id,
                               data=ev.WorkflowResumed(steps=["s1"], deadline_at=rng.choice([None, T0 + timedelta(seconds=9)]))))
    return events


def _statements(rng: random.Random, streams: list[list[NewEvent]]) -> list[list[NewEvent]]:
    """All events of all streams, in order per stream, cut into random statements."""
    pending = [list(s) for s in streams if s]
    statements: list[list[NewEvent]] = []
    while pending:
        statement: list[NewEvent] = []
        for stream in rng.sample(pending, k=rng.randint(1, len(pending))):
            take = rng.randint(1, len(stream))
            statement += stream[:take]
            del stream[:take]
        pending = [s for s in pending if s]
        statements.append(statement)
    return statements


ROWS = {"jobs": "oracle_job_fold", "workflows": "oracle_workflow_fold"}


def _oracle_equals_live(conn) -> int:
    compared = 0
    with conn.cursor(row_factory=dict_row) as cur:
        for table, fold in ROWS.items():
            cur.execute(f"""
                SELECT l.id, to_jsonb(l) AS live, to_jsonb(f.folded) AS folded
                  FROM {table} l,
                       LATERAL (SELECT {fold}(e ORDER BY e.version) AS folded
                                  FROM events e WHERE e.stream_id = l.id) f""")
            for row in cur.fetchall():
                assert row["live"] == row["folded"], row["id"]
                compared += 1
    return compared


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), jobs=st.integers(1, 6), walk=st.integers(1, 9),
       workflows=st.integers(0, 2))
def test_random_event_sequences_fold_alike_live_oracle_and_replay(oracle, seed, jobs, walk, workflows):
    conn, rng = oracle, random.Random(seed)
    streams: list[list[NewEvent]] = []
    workflow_ids = [new_id() for _ in range(workflows)]
    for workflow_id in workflow_ids:
        streams.append(_workflow_events(rng, workflow_id))
    for _ in range(jobs):
        job = JobWalk(rng, new_id(), rng.choice([None, *workflow_ids]))
        for _ in range(walk):
            if not job.step():
                break
        streams.append(job.events)
    for statement in _statements(rng, streams):
        store.append(conn, statement)
    assert _oracle_equals_live(conn) >= jobs + workflows
    assert replay.verify(conn) == []


def test_every_event_type_is_taken_by_the_walks(oracle):
    """The random walks reach every transition of the state machine (so the test above is thorough)."""
    taken: set[tuple[str, str]] = set()
    for seed in range(300):
        rng = random.Random(seed)
        job = JobWalk(rng, new_id(), None)
        status = None
        while len(job.events) < 12 and job.step():
            taken.add((status or states.NEW, job.events[-1].type))
            status = job.status
    assert taken == set(states.JOB_TRANSITIONS)
