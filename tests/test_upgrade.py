"""Upgrades from the 0.1.0 release: a database made and filled by 0.1.0 becomes today's, data in place.

tests/fixtures/qforge-0.1.0/app.zip holds the released code and schema. A database is
migrated with it and filled by a seeded workload run through the 0.1.0
commands (workload.py, in a subprocess with the 0.1.0 package on its path),
which also records what the 0.1.0 API answered. Then today's `qforge migrate`
upgrades it, and everything must still hold.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Iterator

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from qforge import cli
from qforge.api.app import create_app
from qforge.api.server import BackgroundServer
from qforge.commands.claim import claim
from qforge.commands.enqueue import enqueue
from qforge.commands.report import Report, complete
from qforge.commands.specs import JobSpec
from qforge.workflows.engine import trigger
from qforge.db import connect, with_credentials, with_database
from qforge.log.archive import archive
from qforge.audit import checkpoints as audit
from qforge.audit import verify as audit_verify
from qforge.log.archive_check import verify_archive
from qforge.events.states import JOB_FINISHED, WORKFLOW_FINISHED
from qforge.migrate import migrate, status
from qforge.projections import replay

FIXTURE = Path(__file__).parent / "fixtures" / "qforge-0.1.0"
JOBS = 1200
WORKFLOWS = 70


@pytest.fixture(scope="module")
def release_0_1_0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 0.1.0 package (named `app`, as it was then) and its schema/, unpacked."""
    folder = tmp_path_factory.mktemp("qforge-0.1.0")
    with zipfile.ZipFile(FIXTURE / "app.zip") as archive:
        archive.extractall(folder)
    return folder


def _create(admin_url: str, name: str, template: str | None = None) -> str:
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template:
        statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
    with connect(admin_url, autocommit=True) as admin:
        admin.execute(statement)
    return with_database(admin_url, name)


def _drop(admin_url: str, name: str) -> None:
    with connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def filled_by_0_1_0(server_url: str, release_0_1_0: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name of a database made and filled by 0.1.0, what its workload recorded); used as a template."""
    name = f"qf_v010_{secrets.token_hex(4)}"
    url = _create(server_url, name)
    out = tmp_path_factory.mktemp("workload") / "record.json"
    env = {**os.environ, "PYTHONPATH": str(release_0_1_0)}
    env.pop("QFORGE_DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, str(FIXTURE / "workload.py"), url, str(release_0_1_0 / "schema"), str(out),
         "--jobs", str(JOBS), "--workflows", str(WORKFLOWS)],
        cwd=release_0_1_0, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    try:
        yield name, json.loads(out.read_text())
    finally:
        _drop(server_url, name)


@pytest.fixture
def upgraded(server_url: str, filled_by_0_1_0: tuple[str, dict]) -> Iterator[tuple[str, dict]]:
    """A fresh copy of the 0.1.0 database, upgraded by today's migrate."""
    template, record = filled_by_0_1_0
    name = f"t_up_{secrets.token_hex(5)}"
    url = _create(server_url, name, template)
    try:
        with connect(url, autocommit=True) as conn:
            applied = migrate(conn)
            assert applied, "an upgrade from 0.1.0 applies something"
            assert status(conn).current
        yield url, record
    finally:
        _drop(server_url, name)


def test_the_workload_reached_every_status(filled_by_0_1_0: tuple[str, dict]) -> None:
    _, record = filled_by_0_1_0
    assert set(record["counts"]) == {"pending", "running", "succeeded", "dead", "cancelled", "waiting",
                                     "skipped", "blocked"}, record["counts"]
    assert set(record["workflow_counts"]) == {"running", "succeeded", "failed", "cancelled"}
    assert record["waiting_triggers"], "some workflows wait for a trigger"


def test_upgrade_keeps_every_job_and_workflow_and_the_log_replays(upgraded: tuple[str, dict]) -> None:
    url, record = upgraded
    views = record["views"]
    with connect(url, autocommit=True) as conn:
        assert replay.verify(conn) == []
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == record["events"]
        # The upgraded log is checkpointed like a new one, and every chain the upgrade computed holds.
        assert sum(c.events for c in audit.checkpoint(conn)) == record["events"]
        assert audit_verify.verify(conn).problems == []
    with BackgroundServer(create_app(url)) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        for job_id, before in views["jobs"].items():
            after = client.get(f"/jobs/{job_id}").json()
            assert {key: after.get(key) for key in before} == before, job_id
            assert client.get(f"/jobs/{job_id}/events").json() == views["job_events"][job_id], job_id
        for workflow_id, before in views["workflows"].items():
            after = client.get(f"/workflows/{workflow_id}").json()
            assert _same_workflow(before, after), workflow_id
            assert client.get(f"/workflows/{workflow_id}/events").json() == views["workflow_events"][workflow_id]
        for tag, before in views["executions"].items():
            after = client.get("/executions", params={"tag": tag, "limit": 500}).json()
            assert [item["id"] for item in after["items"]] == [item["id"] for item in before["items"]], tag


def _same_workflow(before: dict, after: dict) -> bool:
    """Every field 0.1.0 showed, step by step, is unchanged (new fields may be added)."""
    steps_before, steps_after = before.pop("steps"), after.pop("steps")
    same = {key: after.get(key) for key in before} == before and len(steps_before) == len(steps_after)
    return same and all({key: a.get(key) for key in b} == b for b, a in zip(steps_before, steps_after))


def test_after_the_upgrade_waiting_workflows_finish_and_new_jobs_run(upgraded: tuple[str, dict]) -> None:
    url, record = upgraded
    with connect(url, autocommit=True, row_factory=dict_row) as conn:
        for workflow_id, step in record["waiting_triggers"]:
            trigger(conn, workflow_id, step, {"approved_by": "upgrade test"}, actor="test")
        [new_job] = enqueue(conn, [JobSpec(task="echo", payload={"after": "upgrade"})], actor="test")
        drained = 0
        while claimed := claim(conn, ["default", "emails"], 100, "upgrade-worker"):
            complete(conn, [Report(job.id, job.attempt, result={"ok": True}, workflow_id=job.workflow_id)
                            for job in claimed], actor="upgrade-worker", workflow_ids_known=True)
            drained += len(claimed)
        assert drained > 0
        assert conn.execute("SELECT status FROM jobs WHERE id = %s", (new_job.id,)).fetchone()["status"] \
            == "succeeded"
        for workflow_id, _ in record["waiting_triggers"]:
            row = conn.execute("SELECT status FROM workflows WHERE id = %s", (workflow_id,)).fetchone()
            assert row["status"] in WORKFLOW_FINISHED, (workflow_id, row)
        assert replay.verify(conn) == []


def test_cli_status_after_an_upgrade_lists_adopted_files(server_url: str,
                                                         filled_by_0_1_0: tuple[str, dict],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    name = f"t_st_{secrets.token_hex(5)}"
    url = _create(server_url, name, filled_by_0_1_0[0])
    try:
        assert cli.main(["--database-url", url, "migrate", "--status"]) == 0
        before = capsys.readouterr().out
        assert "recorded before checksums; adopted" in before and "pending  0005_converge_pre_release.sql" in before
        assert cli.main(["--database-url", url, "migrate"]) == 0
        capsys.readouterr()
        assert cli.main(["--database-url", url, "migrate", "--status"]) == 0
        after = capsys.readouterr().out
        assert "0 problem(s), 0 file(s) to apply" in after and "adopted" not in after
    finally:
        _drop(server_url, name)


# ---------------------------------------------------------------------------
# the catalog after an upgrade equals the catalog of a fresh install

CATALOG_QUERIES = {
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod) AS type,
               a.attnotnull, a.attidentity, a.attgenerated, pg_get_expr(d.adbin, d.adrelid) AS default
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE n.nspname = 'public' AND a.attnum > 0 AND NOT a.attisdropped
           AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND NOT c.relispartition
         ORDER BY 1, 2""",
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.reloptions, c.relispartition,
               pg_get_partkeydef(c.oid) AS partition_key,
               pg_get_expr(c.relpartbound, c.oid) AS partition_bound
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') AND NOT c.relispartition
         ORDER BY 1""",
    # How many partitions the log has depends on how long it is; what each holds may not.
    "partitions": """
        SELECT DISTINCT
               (SELECT array_agg(regexp_replace(pg_get_indexdef(i.indexrelid), 'events_[0-9]+', 'events_N', 'g')
                                 ORDER BY 1) FROM pg_index i WHERE i.indrelid = c.oid) AS indexes,
               (SELECT array_agg(t.tgname::text ORDER BY 1) FROM pg_trigger t WHERE t.tgrelid = c.oid) AS triggers,
               (SELECT array_agg(pg_get_constraintdef(k.oid) ORDER BY 1) FROM pg_constraint k
                 WHERE k.conrelid = c.oid) AS constraints
          FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
         WHERE h.inhparent = 'events'::regclass""",
    "indexes": """
        SELECT i.indexname, i.indexdef FROM pg_indexes i JOIN pg_class c ON c.relname = i.tablename
         WHERE i.schemaname = 'public' AND NOT c.relispartition ORDER BY 1""",
    "constraints": """
        SELECT conrelid::regclass::text AS relation, conname, pg_get_constraintdef(oid) AS definition
          FROM pg_constraint
         WHERE connamespace = 'public'::regnamespace
           AND conrelid NOT IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'events'::regclass)
         ORDER BY 1, 2""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS arguments, p.prokind,
               CASE WHEN p.prokind = 'a' THEN NULL ELSE pg_get_functiondef(p.oid) END AS definition
          FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace ORDER BY 1, 2""",
    "aggregates": """
        SELECT aggfnoid::regprocedure::text AS aggregate, aggtransfn::text, aggtranstype::regtype::text
          FROM pg_aggregate a JOIN pg_proc p ON p.oid = a.aggfnoid
         WHERE p.pronamespace = 'public'::regnamespace ORDER BY 1""",
    "triggers": """
        SELECT tgrelid::regclass::text AS relation, tgname, pg_get_triggerdef(t.oid) AS definition, tgenabled
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal AND NOT c.relispartition
         ORDER BY 1, 2""",
    "event_triggers": """
        SELECT evtname, evtevent, evtfoid::regproc::text, evtenabled, evttags FROM pg_event_trigger ORDER BY 1""",
    "types": """
        SELECT t.typname, t.typtype FROM pg_type t
         WHERE t.typnamespace = 'public'::regnamespace AND t.typtype NOT IN ('c')
           AND t.typname !~ '^_?events_[0-9]+$' ORDER BY 1""",
    "schema_migrations": "SELECT name, kind, checksum FROM schema_migrations ORDER BY name",
    # the processes' roles (issue 30): the same privileges, policies and definer functions
    "privileges": """
        SELECT c.relname, a.grantee::regrole::text, a.privilege_type
          FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
         WHERE c.relnamespace = 'public'::regnamespace AND NOT c.relispartition
           AND a.grantee::regrole::text LIKE 'qforge\\_%' ORDER BY 1, 2, 3""",
    "column_privileges": """
        SELECT table_name, column_name, grantee, privilege_type FROM information_schema.column_privileges
         WHERE grantee LIKE 'qforge\\_%' AND table_schema = 'public'
           AND table_name IN (SELECT relname FROM pg_class WHERE NOT relispartition) ORDER BY 1, 2, 3, 4""",
    "policies": """
        SELECT tablename, policyname, roles::text, cmd, qual, with_check FROM pg_policies ORDER BY 1, 2""",
    "definers": """
        SELECT p.oid::regprocedure::text, p.proconfig::text, p.proacl::text FROM pg_proc p
         WHERE p.pronamespace = 'public'::regnamespace AND p.prosecdef ORDER BY 1""",
    "state_transitions": "SELECT * FROM state_transitions ORDER BY 1, 2, 3, 4",
}


def catalog(url: str) -> dict[str, list[tuple]]:
    with connect(url, autocommit=True) as conn:
        return {name: [tuple(row) for row in conn.execute(query).fetchall()]
                for name, query in CATALOG_QUERIES.items()}


def test_an_upgraded_database_has_the_catalog_of_a_fresh_install(upgraded: tuple[str, dict],
                                                                 empty_db_url: str) -> None:
    url, _ = upgraded
    with connect(empty_db_url, autocommit=True) as conn:
        migrate(conn)
    fresh, after_upgrade = catalog(empty_db_url), catalog(url)
    for part in CATALOG_QUERIES:
        assert after_upgrade[part] == fresh[part], part
    assert len(fresh["functions"]) > 10 and len(fresh["indexes"]) > 5 and len(fresh["triggers"]) >= 3


def test_an_upgraded_database_gets_the_roles_and_each_works_within_them(upgraded: tuple[str, dict]) -> None:
    url, _ = upgraded
    worker = with_credentials(url, "qforge_worker", None)
    with connect(worker, autocommit=True, row_factory=dict_row) as conn:
        assert conn.execute("SELECT current_user AS me").fetchone()["me"] == "qforge_worker"
        [job] = enqueue(conn, [JobSpec(task="echo")], actor="worker-made")  # a step a worker may add
        assert claim(conn, ["default"], 1000, "w")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM token_secrets")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT log_close_current()")  # the monitor's, not the worker's


def test_an_upgraded_log_is_archived_whole_and_what_waits_still_finishes(upgraded: tuple[str, dict],
                                                                        scratch_dir: Path) -> None:
    """The 0.1.0 events (now the log's first partition) leave as a segment; the finished executions
    leave the read model, the waiting workflows stay and finish; replay with the archive agrees."""
    url, record = upgraded
    with connect(url, autocommit=True, row_factory=dict_row) as conn:
        done = archive(conn, scratch_dir, close_current=True)
        assert done.events == record["events"]
        assert conn.execute("SELECT count(*) AS n FROM events").fetchone()["n"] == 0
        assert verify_archive(scratch_dir, conn).problems == []
        finished = sorted(JOB_FINISHED), sorted(WORKFLOW_FINISHED)
        assert conn.execute("SELECT count(*) AS n FROM jobs WHERE status = ANY(%s) AND workflow_id IS NULL",
                            (finished[0],)).fetchone()["n"] == 0
        assert conn.execute(  # a finished workflow stays only while one of its steps is active
            "SELECT count(*) AS n FROM workflows w WHERE w.status = ANY(%s) AND NOT EXISTS"
            " (SELECT FROM jobs j WHERE j.workflow_id = w.id AND j.status <> ALL(%s))",
            finished[::-1]).fetchone()["n"] == 0
        assert conn.execute("SELECT count(*) AS n FROM jobs WHERE status <> ALL(%s)",
                            (finished[0],)).fetchone()["n"] == sum(
            n for status, n in record["counts"].items() if status not in JOB_FINISHED)
        assert replay.verify(conn, archive=scratch_dir) == []
        for workflow_id, step in record["waiting_triggers"]:
            trigger(conn, workflow_id, step, {"approved_by": "after the archive"}, actor="test")
        while claimed := claim(conn, ["default", "emails"], 100, "upgrade-worker"):
            complete(conn, [Report(job.id, job.attempt, result={"ok": True}, workflow_id=job.workflow_id)
                            for job in claimed], actor="upgrade-worker", workflow_ids_known=True)
        for workflow_id, _ in record["waiting_triggers"]:
            row = conn.execute("SELECT status FROM workflows WHERE id = %s", (workflow_id,)).fetchone()
            assert row["status"] in WORKFLOW_FINISHED, (workflow_id, row)
        assert replay.verify(conn, archive=scratch_dir) == []
