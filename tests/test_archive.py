"""qforge archive: closed partitions leave the database as verified segments; the read model lets go of
what they hold whole; audits, history and replay still read them; a killed archive loses nothing."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

import httpx
import pytest

from factories import count
from qforge.api.app import create_app
from qforge.cli import main as cli
from qforge.log import archive as archive_module
from qforge.log import common as log_common
from qforge.workflows import engine as wf
from qforge.log.archive import STEPS, archive
from qforge.commands.claim import claim
from qforge.commands.enqueue import JobSpec, enqueue
from qforge.commands.report import Report, complete, fail
from qforge.log import segments
from qforge.log.archive_check import verify_archive
from qforge.projections.replay import ReplayError, replay, verify
from qforge.settings import Settings
from qforge.api.server import BackgroundServer


def maintain(conn) -> None:
    conn.execute("SELECT log_maintain()")


def small_partitions(conn, size: int = 100) -> None:
    conn.execute("UPDATE log_settings SET partition_size = %s, partitions_ahead = 4", (size,))
    conn.execute("SELECT log_close_current()")


def run_all(conn, queue: str = "default", *, error: str | None = None, limit: int = 20) -> list[UUID]:
    jobs = claim(conn, [queue], limit, "w1")
    reports = [Report(j.id, j.attempt, result={"n": 1}, error=error) for j in jobs]
    (fail if error else complete)(conn, reports, actor="w1")
    maintain(conn)
    return [j.id for j in jobs]


@dataclass
class Workload:
    finished: list[UUID]  # jobs that end up succeeded or dead
    pending: list[UUID]  # jobs still pending
    done_workflow: UUID
    waiting_workflow: UUID  # waits on a trigger: its first events get archived, it must go on


def workload(conn) -> Workload:
    small_partitions(conn)
    waiting = wf.submit(conn, wf.WorkflowSpec.model_validate({"name": "approval", "steps": [
        {"step": "prepare", "task": "echo"},
        {"step": "approve", "type": "wait_for_trigger", "depends_on": ["prepare"]},
        {"step": "ship", "task": "echo", "depends_on": ["approve"]}]}), actor="test")[0]
    run_all(conn, limit=1)  # prepare succeeds; approve now waits
    finished = []
    for n in range(6):
        enqueue(conn, [JobSpec(task="echo", tags={"order": f"A-{n}"}) for _ in range(5)], actor="test")
        maintain(conn)
        finished += run_all(conn)
    enqueue(conn, [JobSpec(task="echo", queue="doomed", max_retries=0) for _ in range(3)], actor="test")
    finished += run_all(conn, "doomed", error="boom")
    done = wf.submit(conn, wf.WorkflowSpec.model_validate({"name": "ci", "steps": [
        {"step": "build", "task": "echo"}, {"step": "test", "task": "echo", "depends_on": ["build"]}]}),
        actor="test")[0]
    run_all(conn)
    run_all(conn)
    pending = [o.id for o in enqueue(conn, [JobSpec(task="echo", queue="later") for _ in range(4)], actor="test")]
    maintain(conn)
    return Workload(finished, pending, done, waiting)


@pytest.mark.parametrize("windows", [None, (7, 3)], ids=["default-windows", "small-windows"])
def test_archive_writes_verified_segments_and_the_read_model_keeps_only_what_is_active(conn, db_url, scratch_dir,
                                                                                          monkeypatch, windows):
    if windows is not None:  # many COPY windows per partition, many release windows per segment
        monkeypatch.setattr(archive_module, "READ_WINDOW", windows[0])
        monkeypatch.setattr(archive_module, "RELEASE_POSITIONS", windows[1])
    work = workload(conn)
    events_before = count(conn, "SELECT count(*) FROM events")
    done = archive(conn, scratch_dir, close_current=True, duty=1, busy_duty=1)
    assert len(done.segments) >= 2 and done.events == events_before and done.rested == 0
    assert count(conn, "SELECT count(*) FROM events") == 0
    assert count(conn, "SELECT count(*) FROM archive_segments WHERE state = 'dropped'") == len(done.segments)
    names = {r["name"] for r in conn.execute("SELECT partition::text AS name FROM log_partitions()")}
    assert not names & {f"events_{m['partition']['lower']:019d}" for m in done.segments}

    # Every manifest says what its segment holds; the segments tile the positions.
    for manifest in done.segments:
        assert segments.check_segment(scratch_dir, manifest) == []
        assert {"first_position", "last_position", "events", "first_occurred_at", "last_occurred_at",
                "schema_versions", "sha256"} <= manifest.keys()
    report = verify_archive(scratch_dir, conn)
    assert report.problems == [] and report.events == events_before

    # Finished executions left the read model; active ones stayed, whatever their age.
    assert count(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s)", work.finished) == 0
    assert count(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s)", work.pending) == 4
    assert count(conn, "SELECT count(*) FROM workflows WHERE id = %s", work.done_workflow) == 0
    assert count(conn, "SELECT count(*) FROM workflows WHERE id = %s", work.waiting_workflow) == 1
    assert count(conn, "SELECT count(*) FROM jobs WHERE workflow_id = %s", work.waiting_workflow) == 3
    assert count(conn, "SELECT count(*) FROM execution_tags WHERE id = ANY(%s)", work.finished) == 0
    queued = {(r["queue"], r["status"]): r["n"] for r in conn.execute(
        "SELECT queue, status, sum(n)::int AS n FROM (SELECT queue, status, n FROM queue_counts"
        " UNION ALL SELECT queue, status, n FROM queue_count_deltas) c GROUP BY 1, 2 HAVING sum(n) <> 0")}
    assert queued == {("later", "pending"): 4, ("default", "succeeded"): 1, ("default", "waiting"): 1,
                      ("default", "blocked"): 1}

    # Replay needs the archive now, and with it matches the read model exactly.
    with pytest.raises(ReplayError, match="pass --archive"):
        verify(conn)
    assert verify(conn, archive=scratch_dir) == []

    # The long-lived workflow goes on: its step is triggered, the rest runs, it finishes.
    wf.trigger(conn, work.waiting_workflow, "approve", {"ok": True}, actor="test")
    run_all(conn)
    assert count(conn, "SELECT status FROM workflows WHERE id = %s", work.waiting_workflow) == "succeeded"
    # Pending jobs whose Enqueued was archived run too.
    assert sorted(run_all(conn, "later")) == sorted(work.pending)
    assert verify(conn, archive=scratch_dir) == []
    built, swapped = replay(conn, archive=scratch_dir)
    assert swapped.changed == 0

    # The next archive lets go of what has finished since, found by the events of its partitions:
    # the long-lived workflow (its first events in the segments before, its last in these) with
    # its three steps, and the four jobs that ran late.
    again = archive(conn, scratch_dir, close_current=True, duty=1, busy_duty=1)
    assert (again.workflows_released, again.jobs_released) == (1, 3 + 4)
    assert count(conn, "SELECT count(*) FROM workflows") == 0
    assert count(conn, "SELECT count(*) FROM jobs") == 0
    assert count(conn, "SELECT count(*) FROM execution_tags") == 0
    assert verify(conn, archive=scratch_dir) == []


def test_an_archived_execution_answers_410_naming_its_segment_and_history_reads_it(conn, db_url, scratch_dir,
                                                                                      capsys):
    work = workload(conn)
    job_id = work.finished[0]
    live_history = [e["type"] for e in conn.execute(
        "SELECT type FROM events WHERE stream_id = %s ORDER BY version", (job_id,))]
    archive(conn, scratch_dir, close_current=True)
    app = create_app(db_url, settings=Settings(database_url=db_url, api_token=None))
    with BackgroundServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/events", f"/workflows/{work.done_workflow}"):
            response = client.get(path)
            assert response.status_code == 410, response.text
            body = response.json()
            assert body["error"] == "archived" and body["details"][0]["segment"].startswith("events-")
        assert client.get(f"/jobs/{UUID(int=7)}").status_code == 404
        assert client.get(f"/jobs/{work.pending[0]}").status_code == 200
    capsys.readouterr()
    assert cli(["history", str(job_id), "--archive", str(scratch_dir), "--database-url", db_url]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["type"] for e in lines] == live_history and lines[0]["tags"] == {"order": "A-0"}
    assert cli(["history", str(job_id), "--database-url", db_url]) == 1
    assert "--archive" in capsys.readouterr().err
    # A workflow's history brings its steps' events, archived and live.
    assert cli(["history", str(work.done_workflow), "--archive", str(scratch_dir), "--database-url", db_url]) == 0
    types = [json.loads(line)["type"] for line in capsys.readouterr().out.splitlines()]
    assert types.count("Succeeded") == 2 and types[0] == "WorkflowSubmitted"


def test_archive_verify_finds_a_changed_segment_and_a_missing_one(conn, scratch_dir, capsys):
    workload(conn)
    archive(conn, scratch_dir, close_current=True)
    assert cli(["archive", "verify", str(scratch_dir)]) == 0
    first, second = segments.manifests(scratch_dir)[:2]
    path = scratch_dir / second["file"]
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    at = next(i for i, line in enumerate(lines) if json.loads(line)["version"] == 1)  # its hash is checkable alone
    event = json.loads(lines[at])
    event["actor"] = "someone-else"
    lines[at] = json.dumps(event, separators=(",", ":"))
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    (scratch_dir / first["file"]).unlink()
    capsys.readouterr()
    assert cli(["archive", "verify", str(scratch_dir)]) == 1
    out = capsys.readouterr().out
    assert f"{first['segment']}: the file {first['file']} is missing" in out
    assert f"{second['segment']}: the file's SHA-256 is not the manifest's" in out
    # Even with a manifest rewritten to match, the event's hash gives it away.
    second["sha256"] = segments.file_sha256(path)
    segments.write_manifest(scratch_dir, second)
    report = verify_archive(scratch_dir)
    assert any("its hash does not follow" in p for p in report.problems), report.problems


def test_a_paced_archive_rests_and_archives_the_same(conn, scratch_dir, capsys):
    workload(conn)
    events_before = count(conn, "SELECT count(*) FROM events")
    done = archive(conn, scratch_dir, close_current=True, duty=0.5)
    assert done.events == events_before and count(conn, "SELECT count(*) FROM events") == 0
    assert 0 < done.rested < done.seconds
    assert verify_archive(scratch_dir, conn).problems == []
    with pytest.raises(ValueError, match="share of the time"):
        archive(conn, scratch_dir, duty=0)
    capsys.readouterr()
    assert cli(["archive", "--to", str(scratch_dir), "--duty", "1.5"]) == 2
    assert "--duty is a share of the time" in capsys.readouterr().err


def test_awkward_text_leaves_the_database_byte_for_byte(conn, scratch_dir):
    small_partitions(conn)
    payload = {"path": "C:\\temp\\new", "quote": 'say "hi"', "lines": "a\nb\tc\\n", "unicode": "žluť 🐍",
               "escaped": "\\u0000 \\\\ \\"}
    enqueue(conn, [JobSpec(task="echo", payload=payload, tags={"k": "back\\slash \"q\""})], actor="test")
    run_all(conn)
    stored = {r["position"]: (r["data"], r["tags"]) for r in conn.execute(
        "SELECT position, data::text AS data, tags::text AS tags FROM events")}
    assert any("\\\\" in data for data, _ in stored.values())  # backslashes, escaped in the JSON text
    done = archive(conn, scratch_dir, close_current=True, duty=1, busy_duty=1)
    lines = [json.loads(line) for m in done.segments for line in gzip.open(scratch_dir / m["file"])]
    assert {line["position"]: (line["data"], line["tags"]) for line in lines} == stored
    assert verify_archive(scratch_dir, conn).problems == []  # every hash recomputed from the text as written


def test_copy_blocks_are_split_into_lines_whatever_their_edges():
    blocks = [b'{"a" : "x\\\\y"}\n', b'{"b" : 1}\n{"c"', b' : 2}\n', b'{"d" : 3}\n{"e" : 4}\n', b'{"f"', b' : 5}']
    assert list(archive_module._lines(iter(blocks))) == [
        b'{"a" : "x\\y"}', b'{"b" : 1}', b'{"c" : 2}', b'{"d" : 3}', b'{"e" : 4}', b'{"f" : 5}']


class FakeClock:
    """time.monotonic and time.sleep for Pace: sleeping moves the clock."""

    def __init__(self):
        self.now, self.slept = 100.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds


def test_the_pace_rests_longer_while_the_log_grows_at_a_busy_queues_rate(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(log_common, "time", clock)
    position = [1_000]
    pace = log_common.Pace(0.5, 0.1, lambda: position[0])
    clock.now += 1.0  # a piece of work of 1 s, the log quiet: rests 1 s (duty 0.5)
    pace.rest()
    clock.now += 1.0  # 1 s of work while 500 events were appended over 2 s: busy, rests 9 s
    position[0] += 500
    pace.rest()
    clock.now += 0.3  # 0.3 s of work, nothing appended in 9.3 s: quiet, rests 0.3 s
    pace.rest()
    clock.now += 0.3  # 1,000 appended, but 0.6 s since the last look: no look, still quiet
    position[0] += 1_000
    pace.rest()
    clock.now += 1.0  # the next look sees them (1,000 in 1.9 s): busy
    pace.rest()
    assert clock.slept == [1.0, 9.0, 0.3, 0.3, 9.0]
    assert (pace.rests, pace.busy_rests, pace.rested) == (5, 2, pytest.approx(19.6))
    # A busy share above the quiet one is the quiet one; without a probe, never busy.
    assert log_common.Pace(0.2, 0.5, lambda: 0).busy_duty == 0.2
    quiet = log_common.Pace(0.5, 0.1)
    clock.now += 1.0
    quiet.rest()
    assert clock.slept[-1] == 1.0 and quiet.busy_rests == 0
    with pytest.raises(ValueError, match="busy duty is a share of the time"):
        log_common.Pace(0.5, 0)


def test_an_archive_beside_a_busy_queue_works_at_the_busy_duty(conn, scratch_dir, monkeypatch, capsys):
    workload(conn)
    events_before = count(conn, "SELECT count(*) FROM events")
    # Any growth, even none, counts as busy here, looked at on every rest: each must
    # read the log's position between the archive's statements, and rest at the busy share.
    monkeypatch.setattr(log_common, "BUSY_EVENTS_PER_S", 0.0)
    monkeypatch.setattr(log_common, "LOOK_SECONDS", 0.0)
    done = archive(conn, scratch_dir, close_current=True, duty=1, busy_duty=0.5)
    assert done.events == events_before and done.rests > 0 and done.busy_rests == done.rests
    assert 0 < done.rested < done.seconds
    assert verify_archive(scratch_dir, conn).problems == []
    capsys.readouterr()
    assert cli(["archive", "--to", str(scratch_dir), "--busy-duty", "0"]) == 2
    assert "--busy-duty is a share of the time" in capsys.readouterr().err


def test_older_than_keeps_recent_partitions(conn, scratch_dir):
    workload(conn)
    conn.execute("SELECT log_close_current()")
    from datetime import timedelta

    done = archive(conn, scratch_dir, older_than=timedelta(hours=1))
    assert done.segments == [] and done.skipped
    assert count(conn, "SELECT count(*) FROM archive_segments") == 0


@pytest.mark.parametrize("step", STEPS)
def test_an_archive_killed_at_any_step_loses_nothing_and_runs_again(conn, db_url, scratch_dir, step):
    workload(conn)
    events = {r["position"]: r["hash"] for r in conn.execute("SELECT position, hash FROM events")}
    command = [sys.executable, "-m", "qforge", "archive", "--close-current", "--to", str(scratch_dir),
               "--database-url", db_url]
    killed = subprocess.run(command, env={**os.environ, "QFORGE_ARCHIVE_FAULT": step},
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    again = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert count(conn, "SELECT count(*) FROM events") == 0
    assert count(conn, "SELECT count(*) FROM archive_segments WHERE state <> 'dropped'") == 0
    archived = {}
    for manifest in segments.manifests(scratch_dir):
        for line in segments.read_segment(scratch_dir / manifest["file"]):
            archived[line["position"]] = bytes.fromhex(line["hash"])
    assert archived == {p: bytes(h) for p, h in events.items()}
    assert verify_archive(scratch_dir, conn).problems == []
    assert verify(conn, archive=scratch_dir) == []
