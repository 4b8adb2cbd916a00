"""The day-to-day commands over the API against a real `qforge api`: tables for people, --json for
scripts, the API's filters, the token from QFORGE_API_TOKEN. The first test runs the installed
`qforge` executable; the others run its main() in this process (`cli`), the same code without a
Python start per command (seconds each on a busy machine)."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg

from qforge.commands import schedules
from qforge.commands.claim import claim
from qforge.commands.report import Report, fail
from qforge.producer import enqueue, submit
from remote_support import Remote, cli, rconn  # noqa: F401 (fixtures)

conn = rconn


def ok(result) -> str:
    assert result.returncode == 0, (result.args, result.stdout, result.stderr)
    return result.stdout


def test_jobs_list_and_show_as_tables_and_json(remote: Remote, cli, conn: psycopg.Connection) -> None:
    ids = [enqueue(conn, "echo", {"n": n}, queue="cli-list", tags={"team": "red" if n % 2 else "blue"})
           for n in range(4)]
    listed = json.loads(ok(remote.qforge("jobs", "list", "--queue", "cli-list", "--tag", "team:red", "--json")))
    assert {job["id"] for job in listed} == {str(ids[1]), str(ids[3])}
    people = ok(cli("jobs", "show", str(ids[0]), "--events"))
    assert f"id:            {ids[0]}" in people and "Enqueued" in people and "status:        pending" in people
    missing = cli("jobs", "show", "01a23524-a76e-7000-b064-30a2f9f6ee27")
    assert missing.returncode == 1 and "404" in missing.stderr
    unauthorised = remote.qforge("jobs", "list", token=None)
    assert unauthorised.returncode == 1 and "401" in unauthorised.stderr


def test_workflows_list_show_trigger_cancel_and_resume(cli, conn: psycopg.Connection) -> None:
    waiting = submit(conn, {"name": "cli-approve", "steps": [{"step": "approve", "type": "wait_for_trigger"},
                                                               {"step": "ship", "task": "echo",
                                                                "depends_on": ["approve"]}]})
    table = ok(cli("workflows", "list", "--name", "cli-approve"))
    assert table.splitlines()[0].split()[:3] == ["ID", "NAME", "STATUS"] and str(waiting) in table
    triggered = json.loads(ok(cli("workflows", "trigger", str(waiting), "approve",
                                            "--payload", '{"by": "ops"}', "--json")))
    assert {s["step"]: s["status"] for s in triggered["steps"]} == {"approve": "succeeded", "ship": "pending"}
    cancelled = ok(cli("workflows", "cancel", str(waiting)))
    assert "status:        cancelled" in cancelled
    resumed = json.loads(ok(cli("workflows", "resume", str(waiting), "--json")))
    assert resumed["status"] == "running"
    again = cli("workflows", "cancel", str(waiting), "--json")
    assert again.returncode == 0
    conflict = cli("workflows", "cancel", str(waiting))
    assert conflict.returncode == 1 and "409" in conflict.stderr


def test_definitions_put_run_a_version_and_diff(cli, tmp_path: Path) -> None:
    body = tmp_path / "etl.json"
    body.write_text(json.dumps({"steps": [{"step": "extract", "task": "echo"}]}))
    assert ok(cli("definitions", "put", "cli-etl", str(body))).strip() == "stored cli-etl version 1"
    body.write_text(json.dumps({"steps": [{"step": "extract", "task": "echo"},
                                          {"step": "load", "task": "echo", "depends_on": ["extract"]}]}))
    ok(cli("definitions", "put", "cli-etl", str(body)))
    listed = ok(cli("definitions", "list"))
    assert any(line.split()[:3] == ["cli-etl", "2", "2"] for line in listed.splitlines()), listed
    diff = ok(cli("definitions", "diff", "cli-etl", "1", "2"))
    assert "--- cli-etl version 1" in diff and '+      "step": "load",' in diff
    run = json.loads(ok(cli("definitions", "run", "cli-etl", "--version", "1", "--inputs", '{"day": 2}',
                                      "--json")))
    assert run["definition"] == {"name": "cli-etl", "version": 1}
    assert [s["step"] for s in run["steps"]] == ["extract"]
    refused = cli("definitions", "run", "cli-etl", "--version", "0")
    assert refused.returncode == 2 and "version" in refused.stderr


def test_schedules_create_pause_unpin_and_delete(cli, remote: Remote, conn: psycopg.Connection) -> None:
    with remote.http() as http:
        http.put("/definitions/cli-nightly", json={"steps": [{"step": "a", "task": "echo"}]})
    made = json.loads(ok(cli("schedules", "create", "cli-nightly", "--cron", "0 3 * * *",
                                       "--definition", "cli-nightly", "--version", "1", "--json")))
    assert (made["definition"], made["version"], made["paused"]) == ("cli-nightly", 1, False)
    listed = ok(cli("schedules", "list"))
    assert any(line.split()[:5] == ["cli-nightly", "0", "3", "*", "*"] for line in listed.splitlines()), listed
    assert "paused:        True" in ok(cli("schedules", "pause", "cli-nightly"))
    unpinned = json.loads(ok(cli("schedules", "update", "cli-nightly", "--latest", "--json")))
    assert unpinned.get("version") is None and unpinned["paused"] is True
    assert ok(cli("schedules", "delete", "cli-nightly")).strip() == "deleted cli-nightly"
    assert schedules.get_schedule(conn, "cli-nightly") is None
